"""`TinkerRun`: a run of provider `tinker` executed on a Tinker endpoint through the official
`tinker` SDK, beside `EngineRun` (the CPU engine) as the other implementation of the
`whitney.local.execution.Engine` interface. The server keeps its journal, seq ids, tenants,
leases, limits and recovery; each operation becomes the SDK call of the same meaning, and its
answer Whitney's result. The API key is the SDK's (`TINKER_API_KEY`): never read or kept here.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import os
import threading
import urllib.request
from pathlib import Path
from typing import Any

from whitney import wire
from whitney.errors import (
    InvalidRequest,
    NotFound,
    OperationCancelled,
    Unavailable,
    WhitneyError,
)
from whitney.local import tinker_sdk
from whitney.local.files import archive
from whitney.local.tinker_endpoint import (
    clip_config,
    endpoint_of,
    provider_error,
    reach,
    tinker_datum,
    tokens,
)

CONNECT_TIMEOUT_S = 20.0
"""How long creating the Tinker model may take before the run's creation fails (less than a
client's read timeout, so that the refusal reaches it)."""
POLL_S = 0.25
"""How often a wait on a Tinker future looks at the run's interrupt (cancel)."""
RECORDED_CALLS = 4
"""How many of the latest training operations' request ids the record keeps (one runs)."""
POSITION_KEYS = ("session_id", "model_id", "model_seq_id", "next_request_id")
"""The record's keys that say where the run's training client is (`tinker_sdk.Position`)."""
POINTER = "tinker.json"
"""The file a forwarded `save_state` writes in the checkpoint directory: the Tinker path."""


class Output:
    """An operation's answer, as `EngineRun`'s `OpOutput` has it."""

    def __init__(self, result: dict[str, Any], usage: dict[str, int]) -> None:
        self.result = result
        self.usage = usage


class TinkerRun:
    """One run's Tinker model (a LoRA training client) and its sampling clients. `record`
    keeps, on disk, the model and the Tinker request id each training operation was sent
    under (written before the broker waits), so that after a restart the operation is sent
    again under the same ids, which the Tinker side answers from its record."""

    def __init__(
        self,
        url: str,
        service: Any,
        training: Any,
        step: int,
        record: Path | None = None,
        sampling: Any | None = None,
    ) -> None:
        self.endpoint = endpoint_of(url)
        self._url = url
        self.step = step
        self.interrupt = threading.Event()
        self.seq_id: int | None = None  # the Whitney seq_id the training lane executes
        self.samplers: dict[str, Any] = {}  # sampler id -> its SamplingClient
        self.sampler_paths: dict[str, str] = {}  # sampler id -> its Tinker path
        self._service = service
        self._training = training
        self._sampling = service if sampling is None else sampling  # opens sampling clients
        self._sessions: list[Any] = [service] if sampling is None else [service, sampling]
        self._closed = False
        self._record_path = record
        where = tinker_sdk.position(service, training)
        self._record: dict[str, Any] = {"endpoint": self.endpoint, **where.as_record()}
        self._record["calls"] = {}
        self._save_record()

    def _save_record(self) -> None:
        if self._record_path is None:
            return
        self._record_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._record_path.with_name(self._record_path.name + ".tmp")
        tmp.write_text(json.dumps(self._record))
        os.replace(tmp, self._record_path)

    def _submit(self, submit: Any) -> Any:
        """A training client call, under the request ids recorded for this seq_id if it was
        sent before a restart (else recorded now, before waiting); its answer."""
        seq, calls = self.seq_id, self._record["calls"]
        start = calls.get(str(seq))
        if start is not None and start != self._record["next_request_id"]:
            self._reopen(start)  # sent before the broker restarted: the same Tinker seq ids
        elif start is None and seq is not None:
            calls[str(seq)] = self._record["next_request_id"]
            for old in sorted(calls, key=int)[:-RECORDED_CALLS]:
                del calls[old]
            self._save_record()
        value = self._wait(submit())
        self._record["next_request_id"] = tinker_sdk.position(
            self._service, self._training
        ).next_request_id
        self._save_record()
        return value

    def _reopen(self, request_id: int) -> None:
        """The training client again, its next request under `request_id`."""
        where = tinker_sdk.Position(**{k: self._record[k] for k in POSITION_KEYS})
        try:
            self._training, _ = tinker_sdk.client_at(self._url, where.at(request_id), self._service)
        except Exception as exc:
            raise provider_error(self.endpoint, exc) from None

    @classmethod
    def reconnect(cls, record: Path, *, step: int, sampler_paths: dict[str, str]) -> TinkerRun:
        """The run's Tinker model again after a broker restart: its training client on the
        model's session (kept alive again), a new session for its sampling clients."""
        import tinker

        saved = json.loads(record.read_text())
        url = endpoint = saved["endpoint"]
        reach(url, endpoint)
        where = tinker_sdk.Position(**{key: saved[key] for key in POSITION_KEYS})
        try:
            training, old_session = tinker_sdk.client_at(url, where)
            service = tinker.ServiceClient(base_url=url)
        except Exception as exc:
            raise provider_error(endpoint, exc) from None
        run = cls(url, old_session, training, step, None, sampling=service)
        run._record, run._record_path = saved, record
        for sampler_id, path in sampler_paths.items():
            run.samplers[sampler_id] = run._wait(service.create_sampling_client(model_path=path))
            run.sampler_paths[sampler_id] = path
        return run

    def __repr__(self) -> str:
        return f"TinkerRun(endpoint={self.endpoint!r}, model_id={self.model_id!r})"

    @property
    def model_id(self) -> str:
        return str(self._training.model_id)

    @classmethod
    def create(
        cls,
        url: str,
        *,
        base_model: str,
        lora_rank: int,
        seed: int,
        checkpoint_dir: Path | None = None,
        record: Path | None = None,
    ) -> TinkerRun:
        """A Tinker LoRA model for a new run (from a forwarded checkpoint, with its
        optimizer, when `checkpoint_dir` is one); one-line failure when the endpoint fails."""
        import tinker

        endpoint = endpoint_of(url)
        reach(url, endpoint)
        service = tinker.ServiceClient(base_url=url)
        try:
            if checkpoint_dir is None:
                future = service.create_lora_training_client(
                    base_model=base_model, rank=lora_rank, seed=seed
                )
            else:
                path = read_pointer(checkpoint_dir)
                future = service.create_training_client_from_state_with_optimizer(path)
            training = future.result(CONNECT_TIMEOUT_S)
        except BaseException as exc:
            _close_quietly(service, "errored")
            if isinstance(exc, TimeoutError):
                raise Unavailable(
                    f"tinker endpoint {endpoint} did not create the model within "
                    f"{CONNECT_TIMEOUT_S:g} s: the run is not moved to the CPU engine",
                    details={"endpoint": endpoint},
                ) from None
            raise provider_error(endpoint, exc) from None
        step = 0
        if checkpoint_dir is not None:
            step = int(json.loads((checkpoint_dir / POINTER).read_text())["step"])
        return cls(url, service, training, step, record)

    # --- waiting ------------------------------------------------------------------------

    def _wait(self, api_future: Any) -> Any:
        """The future's value; `OperationCancelled` once the run is cancelled."""
        future = api_future.future()
        while True:
            done, _ = concurrent.futures.wait([future], timeout=POLL_S)
            if done:
                try:
                    return future.result()
                except Exception as exc:
                    raise provider_error(self.endpoint, exc) from None
            if self.interrupt.is_set():
                raise OperationCancelled("the run was cancelled")

    # --- training -----------------------------------------------------------------------

    def forward(self, payload: dict, *, backward: bool) -> Output:
        clip = clip_config(payload["data"])
        data = [tinker_datum(datum, drop=clip.keys()) for datum in payload["data"]]
        loss, config = payload["loss_function"], (payload.get("loss_config") or {}) | clip
        call = self._training.forward_backward if backward else self._training.forward
        output = self._submit(lambda: call(data, loss, config or None))
        outputs = [
            {name: [float(v) for v in tensor.data] for name, tensor in record.items()}
            for record in output.loss_fn_outputs
        ]
        metrics = {key: float(value) for key, value in output.metrics.items()}
        count = sum(len(datum["input"]["token_ids"]) for datum in payload["data"])
        usage = {"tokens": count} | ({"trained_tokens": count} if backward else {})
        result = {"loss": metrics.get("loss:sum", 0.0), "metrics": metrics, "outputs": outputs}
        return Output(result, usage)

    def optim_step(self, optimizer: dict) -> Output:
        from tinker import types

        params = wire.Optimizer.model_validate(optimizer).model_dump(exclude={"type"})
        output = self._submit(lambda: self._training.optim_step(types.AdamParams(**params)))
        self.step += 1
        metrics = {key: float(value) for key, value in (output.metrics or {}).items()}
        return Output({"step": self.step, "metrics": metrics}, {"tokens": 0})

    # --- samplers -----------------------------------------------------------------------

    def save_weights_for_sampler(self, sampler_id: str) -> Output:
        saved = self._submit(lambda: self._training.save_weights_for_sampler(sampler_id))
        sampler = self._sampling.create_sampling_client(model_path=saved.path)
        self.samplers[sampler_id] = self._wait(sampler)
        self.sampler_paths[sampler_id] = saved.path
        return Output({"sampler_id": sampler_id}, {"tokens": 0})

    def write_sampler(self, sampler_id: str, path: Path) -> None:
        """The sampler's weights are Tinker's: the file holds the sampler's Tinker path."""
        path.parent.mkdir(parents=True, exist_ok=True)
        model_path = self.sampler_paths[sampler_id]
        path.write_text(json.dumps({"endpoint": self.endpoint, "model_path": model_path}))

    def _sampler(self, sampler_id: str) -> Any:
        if sampler_id not in self.samplers:
            raise NotFound(f"sampler_id {sampler_id!r} does not exist in this run")
        return self.samplers[sampler_id]

    def sample(
        self,
        sampler_id: str,
        requests: list[dict],
        default_seeds: list[int],
        watch: Any = None,
    ) -> list[Output | WhitneyError]:
        """One Tinker `sample` per request, each with its seed (the run's default where it
        names none, as on the engine). Stop strings go to Tinker, which honours them as it
        samples, so the engine's `watch` for them is not needed here."""
        from tinker import types

        sampler = self._sampler(sampler_id)
        futures: list[tuple[list[int], Any]] = []  # a Tinker future, or the request's refusal
        for request, seed in zip(requests, default_seeds, strict=True):
            parsed = wire.SampleRequest.model_validate(request)
            params = parsed.sampling_params
            prompt = tokens(request["prompt"])
            if params.stop and params.stop_token_ids:  # one Tinker `stop` cannot hold both
                refusal = InvalidRequest(
                    "sampling_params: Tinker takes stop strings or stop_token_ids, not both",
                    details={"field": "sampling_params.stop"},
                )
                futures.append((prompt, refusal))
                continue
            sampling = types.SamplingParams(
                max_tokens=params.max_tokens,
                temperature=params.temperature,
                top_p=params.top_p,
                top_k=-1 if params.top_k is None else params.top_k,
                stop=list(params.stop) or list(params.stop_token_ids) or None,
                seed=seed if params.seed is None else params.seed,
            )
            futures.append(
                (
                    prompt,
                    sampler.sample(
                        types.ModelInput.from_ints(prompt), parsed.num_samples, sampling
                    ),
                )
            )
        outputs: list[Output | WhitneyError] = []
        for prompt, future in futures:
            if isinstance(future, WhitneyError):
                outputs.append(future)
                continue
            answer = self._wait(future)
            sequences = [
                {
                    "tokens": [int(t) for t in sequence.tokens],
                    "logprobs": [float(v) for v in sequence.logprobs or []],
                    "stop_reason": str(sequence.stop_reason),
                }
                for sequence in answer.sequences
            ]
            sampled = sum(len(s["tokens"]) for s in sequences)
            usage = {
                "tokens": len(prompt) + sampled,
                "prefill_tokens": len(prompt),
                "sampled_tokens": sampled,
            }
            outputs.append(Output({"sequences": sequences, "prompt_tokens": len(prompt)}, usage))
        return outputs

    def logprobs(self, sampler_id: str, request: dict) -> Output:
        """`compute_logprobs` of each sequence (None first, as on the engine)."""
        from tinker import types

        sampler = self._sampler(sampler_id)
        sequences = [tokens(sequence) for sequence in request["sequences"]]
        futures = [
            sampler.compute_logprobs(types.ModelInput.from_ints(tokens)) for tokens in sequences
        ]
        result = [
            [None if v is None else float(v) for v in self._wait(future)] for future in futures
        ]
        return Output({"logprobs": result}, {"tokens": sum(len(s) for s in sequences)})

    # --- checkpoints --------------------------------------------------------------------

    def save_state(self, directory: Path) -> Output:
        """Tinker keeps the state; `directory` keeps its Tinker path (and the step)."""
        saved = self._submit(lambda: self._training.save_state(Path(directory).name))
        directory.mkdir(parents=True, exist_ok=True)
        pointer = {"endpoint": self.endpoint, "path": saved.path, "step": self.step}
        (directory / POINTER).write_text(json.dumps(pointer))
        return Output({"step": self.step}, {"tokens": 0})

    def load_state(self, directory: Path, *, with_optimizer: bool = True) -> Output:
        path = read_pointer(directory)
        training = self._training
        load = training.load_state_with_optimizer if with_optimizer else training.load_state
        self._submit(lambda: load(path))
        self.step = int(json.loads((directory / POINTER).read_text())["step"])
        return Output({"step": self.step}, {"tokens": 0})

    def export_lora(self, archive_path: Path) -> Output:
        """`save_weights_external`, its files fetched through their signed URLs and written as
        the engine's archive (the same bytes when the files are the same)."""
        saved = self._submit(lambda: self._training.save_weights_external(archive_path.stem))
        import tinker

        rest = tinker.RestClient(base_url=self._url)
        urls = self._wait(rest.get_external_weights_urls(saved.path)).urls
        files = {}
        for name, url in urls.items():
            with urllib.request.urlopen(url, timeout=CONNECT_TIMEOUT_S) as answer:  # noqa: S310
                files[name] = answer.read()
        data = archive(files)
        archive_path.parent.mkdir(parents=True, exist_ok=True)
        archive_path.write_bytes(data)
        sha256 = hashlib.sha256(data).hexdigest()
        return Output({"format": "peft", "sha256": sha256, "bytes": len(data)}, {"tokens": 0})

    # --- the end ------------------------------------------------------------------------

    def close(self, status: str) -> None:
        """The run ended (`finished`, `cancelled`, `failed`): end the Tinker session, which
        frees its model."""
        if self._closed:
            return
        self._closed = True
        reason = {"finished": "success", "cancelled": "interrupted"}.get(status, "errored")
        for session in reversed(self._sessions):
            _close_quietly(session, reason)


def check_loadable(directory: Path, *, forwarded: bool, uri: str, field: str) -> None:
    """InvalidRequest naming `field` when a checkpoint saved on Tinker goes to a run of the CPU
    engine (its state is not on this server)."""
    if not forwarded and (Path(directory) / POINTER).exists():
        raise InvalidRequest(
            f"{field}: checkpoint {uri!r} was saved by a run forwarded to Tinker (its state is "
            "on the Tinker endpoint): only a run of provider tinker on a server forwarding to "
            "that endpoint can load it, and this run trains on the CPU engine",
            details={"field": field},
        )


def read_pointer(directory: Path) -> str:
    """The Tinker path a forwarded checkpoint directory names."""
    try:
        return str(json.loads((Path(directory) / POINTER).read_text())["path"])
    except (OSError, ValueError, KeyError):
        raise InvalidRequest(
            "checkpoint: not a checkpoint of a run forwarded to Tinker (its state is on this "
            "server's CPU engine)",
            details={"field": "checkpoint"},
        ) from None


def _close_quietly(service: Any, status: str) -> None:
    with contextlib.suppress(Exception):  # the endpoint may be gone: its session lapses
        service.close(status).result(CONNECT_TIMEOUT_S)
