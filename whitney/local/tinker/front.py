"""`TinkerFront`: Tinker's calls as Whitney sessions, runs and operations of the same service.

A training client (`create_model`) is a run of provider `tinker`; each of its requests is an
operation of that run, submitted through `Operations.submit` like any other, so the journal,
admission, limits, leases, the reaper and restart recovery hold for it. A sampling session is
a sampler of a run (`<run_id>~<sampler_id>`), sampled by operations of that run. The request
store remembers which `seq_id`s each Tinker request got: a retry resubmits the same
operations, which the journal answers from their stored twins, so nothing runs twice.
Plain Python called from worker threads, like the rest of the service.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from whitney import wire
from whitney.errors import InvalidRequest, NotFound, Unauthorized, WhitneyError
from whitney.local.api_errors import from_validation_error, not_found
from whitney.local.journal import canonical_json
from whitney.local.operations import RawJson, Waiting
from whitney.local.service import WhitneyService
from whitney.local.tinker import SDK_VERSION, proto, translate
from whitney.local.tinker.proto import ForwardBackwardIn
from whitney.local.tinker.store import RequestStore, TinkerRequest

BASE_SAMPLER = "base"
"""The sampler a base-model sampling session samples: its frozen run's first operation."""
LONG_POLL_S = 20.0
"""How long `retrieve_future` holds a request that is not done (the SDK waits 45 s)."""


@dataclass(frozen=True)
class Done:
    """A future's answer: a JSON object, or protobuf bytes."""

    json: dict[str, Any] | None = None
    proto: bytes | None = None


@dataclass(frozen=True)
class Submitted:
    """A request's future (the SDK's `UntypedAPIFuture`) and, while its last operation is not
    done, the `Waiting` on it: the route holds the answer on it up to the server's
    `post_wait_s`, as Whitney's POST of an operation does, so that the SDK's
    `retrieve_future` finds it done."""

    future: dict[str, Any]
    pending: Waiting | None = None


def _hash(value: Any) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def _seq_id(body: dict[str, Any]) -> int:
    seq_id = body.get("seq_id")
    if not isinstance(seq_id, int) or isinstance(seq_id, bool) or not 0 <= seq_id < 2**31:
        raise translate.bad("seq_id", "expected an integer in 0..2^31-1 (the SDK's int32)")
    return seq_id


def _text(body: dict[str, Any], field: str) -> str:
    value = body.get(field)
    if not isinstance(value, str) or not value:
        raise translate.bad(field, "expected a non-empty string")
    return value


class TinkerFront:
    """The Tinker API over `service`."""

    def __init__(self, service: WhitneyService) -> None:
        self.service = service
        self.store = RequestStore(service.data_dir / "tinker.sqlite3")

    def authenticate(self, api_key: str | None) -> str:
        """The tenant of an `X-API-Key`: a server key, or `tml-` followed by one."""
        if not api_key:
            raise Unauthorized("missing X-API-Key header (TINKER_API_KEY)")
        try:
            return self.service.authenticate(f"Bearer {api_key}")
        except Unauthorized:
            if not api_key.startswith("tml-"):
                raise
            return self.service.authenticate(f"Bearer {api_key.removeprefix('tml-')}")

    # sessions and models

    def create_session(self, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
        session = self.service.sessions.create(tenant, {"labels": {}}, None)
        answer = {"type": "create_session", "session_id": session["session_id"]}
        if body.get("sdk_version") != SDK_VERSION:
            answer["warning_message"] = (
                f"this server is checked against tinker {SDK_VERSION}, not "
                f"{str(body.get('sdk_version'))[:32]}"
            )
        return answer

    def heartbeat(self, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
        self.service.sessions.heartbeat(tenant, _text(body, "session_id"))
        return {"type": "session_heartbeat"}

    def finish_session(self, tenant: str, session_id: str) -> dict[str, Any]:
        self.service.sessions.close(tenant, session_id)
        return {}

    def capabilities(self) -> dict[str, Any]:
        models = self.service.capabilities()["providers"]["tinker"]["base_models"]
        return {
            "supported_models": [
                {"model_name": name, "trainable": True, "sampleable": True} for name in models
            ]
        }

    def create_model(self, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
        session_id = _text(body, "session_id")
        model_seq_id = body.get("model_seq_id")
        if not isinstance(model_seq_id, int):
            raise translate.bad("model_seq_id", "expected an integer")
        optimizer = body.get("optimizer_config") or {"type": "adamw"}
        if optimizer.get("type", "adamw") != "adamw":
            raise translate.refused("optimizer_config.type", f"the {optimizer['type']!r} optimizer")
        lora = body.get("lora_config")
        session_id = _text(body, "session_id")
        run = {
            "session_id": session_id,
            "provider": "tinker",
            "base_model": _text(body, "base_model"),
            "lora_rank": translate.check_lora(lora),
            "seed": (lora or {}).get("seed"),
        }
        key = f"tinker-model:{session_id}:{model_seq_id}"
        run_id = self.service.runs.create(tenant, run, key)["run_id"]
        return {"request_id": f"model:{run_id}", "model_id": run_id}

    def get_info(self, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
        run = self._model(tenant, body)
        base_model = run["base_model"]
        tokenizer = None if base_model.startswith("local/") else base_model.removeprefix("hf:")
        return {
            "type": "get_info",
            "model_id": run["run_id"],
            "model_data": {"arch": None, "model_name": base_model, "tokenizer_id": tokenizer},
            "is_lora": True,
            "lora_rank": run["lora_rank"],
            "model_name": base_model,
        }

    def unload_model(self, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
        run = self._model(tenant, body)
        if run["status"] in ("ready", "allocating"):
            self.service.runs.finish(tenant, run["run_id"])
        return {"request_id": f"unload:{run['run_id']}", "model_id": run["run_id"]}

    def _model(self, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
        model_id = _text(body, "model_id")
        try:
            return self.service.runs.get(tenant, self.store.resolve(tenant, model_id))
        except NotFound:
            raise not_found("model", model_id) from None

    def _run_id(self, tenant: str, body: dict[str, Any]) -> str:
        return self.store.resolve(tenant, _text(body, "model_id"))

    # training requests

    def forward_backward(self, tenant: str, request: ForwardBackwardIn) -> Submitted:
        kind, payload = translate.forward_payload(request)
        run_id = self.store.resolve(tenant, request.model_id)
        return self._submit(tenant, run_id, request.seq_id, [(kind, None, payload)])

    def optim_step(self, tenant: str, body: dict[str, Any]) -> Submitted:
        operation = ("optim_step", None, translate.optimizer(body))
        return self._submit(tenant, self._run_id(tenant, body), _seq_id(body), [operation])

    def save_weights(self, tenant: str, body: dict[str, Any]) -> Submitted:
        operation = ("save_state", None, {"name": _text(body, "path")})
        return self._submit(tenant, self._run_id(tenant, body), _seq_id(body), [operation])

    def save_weights_for_sampler(self, tenant: str, body: dict[str, Any]) -> Submitted:
        name = body.get("path")
        if body.get("kind", "snapshot") != "snapshot":
            raise translate.refused("kind", f"{body['kind']!r} sampling clients (snapshot only)")
        operation = ("save_weights_for_sampler", None, {} if name is None else {"name": name})
        return self._submit(tenant, self._run_id(tenant, body), _seq_id(body), [operation])

    def save_weights_external(self, tenant: str, body: dict[str, Any]) -> Submitted:
        """The PEFT adapter exported (`export_lora`); its path names the artifact."""
        if body.get("age_encryption_recipients"):
            raise translate.refused("age_encryption_recipients", "encrypted exports")
        operation = ("export_lora", None, {})
        return self._submit(tenant, self._run_id(tenant, body), _seq_id(body), [operation])

    def load_weights(self, tenant: str, body: dict[str, Any]) -> Submitted:
        """A checkpoint into a model; with `session_id`, into a new model (create-via-load)."""
        run_id, name = translate.parse_path(body.get("path"), "path", sampler=False)
        source = self.service.runs.own(tenant, run_id)
        checkpoint = self.service.files.checkpoint_uri(run_id, name)
        payload = {"checkpoint": checkpoint, "with_optimizer": bool(body.get("optimizer"))}
        operation = ("load_state", None, payload)
        if body.get("session_id") is None:
            return self._submit(tenant, self._run_id(tenant, body), _seq_id(body), [operation])
        session_id = _text(body, "session_id")
        model_seq_id = body.get("model_seq_id")
        if not isinstance(model_seq_id, int):
            raise translate.bad("model_seq_id", "expected an integer")
        session_id = _text(body, "session_id")
        run = {
            "session_id": session_id,
            "provider": "tinker",
            "base_model": source["base_model"],
            "lora_rank": source["lora_rank"],
        }
        key = f"tinker-model:{session_id}:{model_seq_id}"
        new_run = self.service.runs.create(tenant, run, key)["run_id"]
        alias = f"{session_id}:train:{model_seq_id}"
        self.store.alias(alias, tenant, new_run)
        submitted = self._submit(tenant, new_run, 0, [operation])
        return Submitted({**submitted.future, "model_id": alias}, submitted.pending)

    # sampling

    def create_sampling_session(self, tenant: str, body: dict[str, Any]) -> dict[str, Any]:
        model_path = body.get("model_path")
        seq = body.get("sampling_session_seq_id")
        if model_path is not None:
            run_id, sampler_id = translate.parse_path(model_path, "model_path", sampler=True)
            self.service.runs.own(tenant, run_id)
            # a client's requests are a stream of their own (each numbers them from 0)
            client = f"{body.get('session_id')}.{seq}"
            return {
                "type": "create_sampling_session",
                "sampling_session_id": translate.session_id(run_id, sampler_id, client),
            }
        session_id = _text(body, "session_id")
        run = {
            "session_id": session_id,
            "provider": "tinker",
            "base_model": _text(body, "base_model"),
            "trainable": False,
        }
        key = f"tinker-sampler:{session_id}:{seq}"
        run_id = self.service.runs.create(tenant, run, key)["run_id"]
        save = ("save_weights_for_sampler", None, {"name": BASE_SAMPLER})
        self._submit(tenant, run_id, 0, [save], stream=f"{run_id}~create")
        return {
            "type": "create_sampling_session",
            "sampling_session_id": translate.session_id(run_id, BASE_SAMPLER),
        }

    def get_sampler(self, tenant: str, sampling_session_id: str) -> dict[str, Any]:
        run_id, sampler_id = translate.parse_session(sampling_session_id)
        run = self.service.runs.own(tenant, run_id)
        path = None
        if sampler_id != BASE_SAMPLER or run["trainable"]:
            path = translate.checkpoint_path(run_id, sampler_id, sampler=True)
        return {
            "sampler_id": sampling_session_id,
            "base_model": run["base_model"],
            "model_path": path,
        }

    def asample(self, tenant: str, body: dict[str, Any]) -> Submitted:
        session = body.get("sampling_session_id")
        if session is None:
            raise translate.bad("sampling_session_id", "required (create a sampling session)")
        run_id, sampler_id = translate.parse_session(session)
        sample, logprobs = translate.sample_payloads(body)
        operations = [("sample", sampler_id, sample)]
        if logprobs is not None:
            operations.append(("logprobs", sampler_id, logprobs))
        submitted = self._submit(tenant, run_id, _seq_id(body), operations, session)
        request_id, count = submitted.future["request_id"], sample["num_samples"]
        submitted.future["sample_sequence_ids"] = [f"{request_id}/{i}" for i in range(count)]
        return submitted

    # the request store

    def _submit(
        self,
        tenant: str,
        run_id: str,
        tinker_seq: int,
        operations: list[tuple[str, str | None, dict[str, Any]]],
        stream: str | None = None,
    ) -> Submitted:
        """The future of a Tinker request: its operations journaled once, in order."""
        run = self.service.runs.own(tenant, run_id, live=True)
        stream = run_id if stream is None else stream
        for kind, _, payload in operations:  # refused naming the field, before any hash
            try:
                wire.validate_payload(kind, payload)
            except ValidationError as exc:
                raise from_validation_error(exc, "payload") from None
        body_hash = _hash([[k, s, p] for k, s, p in operations])
        with self.store.run_lock(run_id):
            found = self.store.find(stream, tinker_seq)
            if found is None:
                if stream == run_id:
                    self._check_order(stream, tinker_seq)
                first = max(self.store.next_seq(run_id), int(run.get("next_seq_id", 1)))
                found = TinkerRequest(
                    request_id=f"{stream}#{tinker_seq}",
                    tenant=tenant,
                    stream=stream,
                    tinker_seq=tinker_seq,
                    kind=operations[0][0],
                    run_id=run_id,
                    seq_ids=tuple(range(first, first + len(operations))),
                    body_hash=body_hash,
                )
                self.store.insert(found)
                try:
                    last = self._journal(tenant, found, operations)
                except WhitneyError:
                    self.store.forget(found)
                    raise
            elif found.body_hash != body_hash or found.tenant != tenant:
                raise InvalidRequest(
                    f"seq_id: {tinker_seq} of {stream} was used by another request",
                    details={"field": "seq_id", "seq_id": tinker_seq},
                )
            else:
                last = self._journal(tenant, found, operations)
        future = {"request_id": found.request_id, "model_id": run_id}
        return Submitted(future, last if isinstance(last, Waiting) else None)

    def _check_order(self, stream: str, tinker_seq: int) -> None:
        """A training client's `seq_id`s only grow (a refused request leaves a gap)."""
        last = self.store.last_seq(stream)
        if tinker_seq <= last:
            raise InvalidRequest(
                f"seq_id: {tinker_seq} is out of order for model {stream}: it is past "
                f"(the last request was {last})",
                details={"field": "seq_id", "seq_id": tinker_seq, "last": last},
            )

    def _journal(
        self,
        tenant: str,
        request: TinkerRequest,
        operations: list[tuple[str, str | None, dict[str, Any]]],
    ) -> RawJson | Waiting:
        """Submit (or resubmit) the request's operations, in order; the last one's answer."""
        answers = [
            self.service.operations.submit(
                tenant,
                request.run_id,
                sampler_id,
                {"seq_id": seq, "kind": kind, "payload": payload},
            )
            for seq, (kind, sampler_id, payload) in zip(request.seq_ids, operations, strict=True)
        ]
        return answers[-1]

    # futures

    def poll(self, tenant: str, request_id: str, wait_s: float) -> Done | Waiting | None:
        """A future's answer, a `Waiting` on its first unfinished operation, or None (try
        again)."""
        if request_id.startswith(("model:", "unload:")):
            model_id = request_id.partition(":")[2]
            self.service.runs.own(tenant, model_id)
            kind = "create_model" if request_id.startswith("model:") else "unload_model"
            return Done(json={"type": kind, "model_id": model_id})
        request = self.store.get(request_id)
        if request is None or request.tenant != tenant:
            raise not_found("future", request_id)
        results = []
        for seq_id in request.seq_ids:
            answer = self.service.operations.get(tenant, request.run_id, seq_id, wait_s)
            if isinstance(answer, Waiting):
                return answer
            operation = json.loads(answer.text)
            if operation["status"] not in ("succeeded", "failed", "cancelled"):
                return None
            if operation["status"] != "succeeded":
                return Done(json=_failure(operation))
            results.append(operation["result"])
        return Done(**_answer(request, results))


def _failure(operation: dict[str, Any]) -> dict[str, Any]:
    error = operation.get("error") or {"type": "cancelled", "message": "the run was cancelled"}
    category = "server" if error.get("type") in ("internal", "unavailable") else "user"
    return {"error": f"{error['type']}: {error['message']}", "category": category}


def _answer(request: TinkerRequest, results: list[dict[str, Any]]) -> dict[str, Any]:
    """The Tinker answer of a request's Whitney results (`Done`'s fields)."""
    run_id, result = request.run_id, results[0]
    if request.kind in ("forward", "forward_backward"):
        return {"proto": proto.encode_forward_backward_output(result["outputs"], result["metrics"])}
    if request.kind == "optim_step":
        return {"json": {"metrics": result["metrics"]}}
    if request.kind == "save_state":
        name = result["checkpoint"].rsplit("/", 1)[1]
        return {
            "json": {"type": "save_weights", "path": translate.checkpoint_path(run_id, name, False)}
        }
    if request.kind == "export_lora":
        path = f"{translate.TINKER_SCHEME}{run_id}/external_weights/{result['artifact_id']}"
        return {
            "json": {"type": "save_weights_external", "path": path, "size_bytes": result["bytes"]}
        }
    if request.kind == "load_state":
        return {"json": {"type": "load_weights", "model_id": run_id}}
    if request.kind == "save_weights_for_sampler":
        sampler_id = result["sampler_id"]
        return {
            "json": {
                "type": "save_weights_for_sampler",
                "path": translate.checkpoint_path(run_id, sampler_id, True),
                "sampling_session_id": translate.session_id(run_id, sampler_id),
            }
        }
    prompt = translate.prompt_logprobs(results[1]) if len(results) > 1 else None
    return {"proto": proto.encode_sample_response(result["sequences"], prompt)}
