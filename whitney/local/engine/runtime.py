"""EngineRun: one Whitney training run on the CPU (base model, LoRA, optimizer, sampler
snapshots), with the operations the embedded server calls. Each operation has `validation`
check its request first. No global RNG state is used."""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from whitney.errors import (
    InvalidRequest,
    NonFiniteResult,
    NotFound,
    OperationCancelled,
    UnsupportedBaseModel,
    WhitneyError,
)
from whitney.local.engine import checkpoint, exact, losses, memory, validation
from whitney.local.engine.lora import Lora
from whitney.local.engine.model import (
    CONFIGS,
    ExactLinear,
    LayerWeights,
    Llama,
    ModelConfig,
    init_weights,
)
from whitney.local.engine.optim import AdamW
from whitney.local.engine.sampling import Watch, sample

BASE_MODELS: tuple[str, ...] = ("local/nano", "local/tiny", "local/small")
SAMPLER_MODELS_KEPT = 2  # merged sampling copies kept built; older snapshots are rebuilt on use
LOGPROBS_CHUNK = 16  # sequences per forward in `logprobs` (any chunking gives the same bits)
FORWARD_CHUNK = 16  # datums per forward pass in `forward` / `forward_backward`, likewise
CHUNK_TOKENS = 2048  # and at most this many positions (padding included), unless one datum
SAVED_ACTIVATIONS = 1 << 31  # bytes of a backward's activations above which layers recompute

_bases: dict[str, tuple[ModelConfig, dict[str, Tensor]]] = {}
_bases_lock = threading.Lock()


@dataclass(frozen=True)
class OpOutput:
    result: dict  # the operation's result exactly as docs/api.md specifies
    usage: dict[str, int]  # {"tokens": n, plus prefill/sampled/trained tokens where they apply}


def base_key(name: str, hf_cache: Path | None = None) -> str:
    """What a base model's weights are cached under: a `local/*` name, or the directory of a
    Hugging Face checkpoint (`hf:<dir>`, or a repo id's snapshot in `hf_cache`)."""
    if name in CONFIGS:
        return name
    from whitney.local.engine import hf_backend

    if not hf_backend.is_hf_name(name):
        raise UnsupportedBaseModel(
            f"unsupported base model {name!r}: use {', '.join(BASE_MODELS)}, a Hugging Face "
            "repo id (owner/name) in the local cache, or hf:<repo id or directory>",
            details={"base_model": name},
        )
    return str(hf_backend.source_directory(name, hf_cache))


def load_base(name: str, key: str) -> tuple[ModelConfig, dict[str, Tensor]]:
    """A base model's config and read-only weights (`key`: its `base_key`), built once per
    process and shared."""
    with _bases_lock:
        if key not in _bases:
            if name in CONFIGS:
                _bases[key] = (CONFIGS[name], init_weights(CONFIGS[name]))
            else:
                from whitney.local.engine import hf_backend

                _bases[key] = hf_backend.load(name, Path(key))
        return _bases[key]


def shared_if_equal(key: str, weights: dict[str, Tensor]) -> dict[str, Tensor]:
    """The cached base weights if a checkpoint's are equal (saves memory), else the checkpoint's."""
    with _bases_lock:
        cached = _bases.get(key)
    same = cached is not None and cached[1].keys() == weights.keys()
    if same and all(torch.equal(cached[1][n], weights[n]) for n in weights):
        return cached[1]
    return weights


def non_finite(what: str) -> NonFiniteResult:
    return NonFiniteResult(
        f"the operation's {what} would not be finite (NaN or infinity); it was not applied and "
        "the run's state is what it was before it",
        details={"quantity": what},
    )


def require_finite(what: str, *tensors: Tensor) -> None:
    """Raise `NonFiniteResult` naming `what` unless every element of `tensors` is finite."""
    if not all(bool(torch.isfinite(t).all()) for t in tensors):
        raise non_finite(what)


def all_finite(values: Iterable[float]) -> bool:
    return all(math.isfinite(v) for v in values)


def collate(data: list[validation.Datum]) -> tuple[Tensor, dict[str, Tensor], list[int]]:
    """Right-pad checked datums into token ids [B, T] and loss inputs [B, T] (0 past a datum's
    end; NaN where a datum lacks an optional tensor; `weights` defaults to 1)."""
    lengths = [len(datum.token_ids) for datum in data]
    B, T = len(data), max(lengths)
    valid = torch.arange(T)[None, :] < torch.tensor(lengths)[:, None]
    ids = torch.zeros(B, T, dtype=torch.long)
    inputs: dict[str, Tensor] = {"weights": valid.float()}
    for i, datum in enumerate(data):
        n = lengths[i]
        ids[i, :n] = torch.tensor(datum.token_ids)
        if datum.target_tokens is not None:
            targets = inputs.setdefault("target_tokens", torch.zeros(B, T, dtype=torch.long))
            targets[i, :n] = torch.tensor(datum.target_tokens)
        for name, values in datum.floats.items():
            if name not in inputs:
                inputs[name] = torch.where(valid, torch.nan, 0.0)
            inputs[name][i, :n] = torch.tensor(values, dtype=torch.float32)
    return ids, inputs, lengths


def forward_chunks(order: list[int], lengths: list[int]) -> list[list[int]]:
    """Datums in `order` (by length) cut into forward passes of at most FORWARD_CHUNK datums and
    CHUNK_TOKENS padded positions (a longer datum alone)."""
    chunks: list[list[int]] = []
    for i in order:
        last = chunks[-1] if chunks else []
        fits = len(last) < FORWARD_CHUNK and (len(last) + 1) * lengths[i] <= CHUNK_TOKENS
        if last and fits:
            last.append(i)
        else:
            chunks.append([i])
    return chunks


def activation_bytes(cfg: ModelConfig, tokens: int) -> int:
    """About what a backward keeps of a forward of `tokens` positions (float32 activations)."""
    return 4 * tokens * cfg.num_layers * (10 * cfg.hidden_size + 5 * cfg.intermediate_size)


class EngineRun:
    """A run's live state: base weights (shared), LoRA, optimizer, value head, sampler snapshots."""

    def __init__(
        self,
        base_model: str,
        cfg: ModelConfig,
        base_weights: dict[str, Tensor],
        lora: Lora,
        role: str,
        trainable: bool,
        value_head: dict[str, Tensor],
        base_key: str,
    ) -> None:
        self.base_model, self.cfg, self.base_weights = base_model, cfg, base_weights
        self.base_key = base_key  # where load_base keeps the base weights
        self.lora = lora.requires_grad_()
        self.role, self.trainable = role, trainable
        self.value_head = {n: t.requires_grad_() for n, t in value_head.items()}
        self.model = Llama(cfg, base_weights, self.lora)
        self.optimizer = AdamW(self.trainable_parameters())
        self.step = 0
        self.weights_version = 0  # bumped whenever the adapter changes
        self.snapshots: dict[int, Lora] = {}  # weights_version -> adapter snapshot
        self.snapshot_bases: dict[int, dict[str, Tensor]] = {}  # and the base it adapts
        self.samplers: dict[str, int] = {}  # sampler_id -> weights_version
        self.sampler_models: OrderedDict[int, Llama] = OrderedDict()
        self.trainer_layers: tuple[int, Llama, list[LayerWeights]] | None = None  # see `layers`
        self.interrupt = threading.Event()  # set to cancel the running operation (the worker's)

    @classmethod
    def create(
        cls,
        *,
        base_model: str,
        lora_rank: int,
        seed: int,
        role: str = "policy",
        trainable: bool = True,
        checkpoint_dir: Path | None = None,
        hf_cache: Path | None = None,
    ) -> EngineRun:
        """A new run; with checkpoint_dir, its base weights, adapter, optimizer and step.
        A Hugging Face repo id is looked up in `hf_cache` (default: the environment's)."""
        validation.check_run(role, lora_rank)
        key = base_key(base_model, hf_cache)
        cfg, weights = load_base(base_model, key)
        value_head = {}
        if role == "critic":
            gen = torch.Generator().manual_seed(seed)
            value_head = {
                "value_head.weight": torch.randn(1, cfg.hidden_size, generator=gen) * 0.02,
                "value_head.bias": torch.zeros(1),
            }
        lora = Lora.init(cfg, lora_rank, seed)
        run = cls(base_model, cfg, weights, lora, role, trainable, value_head, key)
        if checkpoint_dir is not None:
            run.restore(Path(checkpoint_dir), with_optimizer=True)
        return run

    def trainable_parameters(self) -> dict[str, Tensor]:
        return self.lora.parameters() | self.value_head

    def require_trainable(self, op: str) -> None:
        if not self.trainable:
            raise InvalidRequest(f"{op}: this run is frozen (trainable: false)")

    def require_policy(self, op: str) -> None:
        if self.role != "policy":
            raise InvalidRequest(f"{op}: a critic run has no sampler")

    def check_interrupt(self) -> None:
        """Raise `OperationCancelled` once `interrupt` is set (a cheap check, called often)."""
        if self.interrupt.is_set():
            raise OperationCancelled("the run was cancelled while this operation ran")

    # --- training -------------------------------------------------------------------------

    def forward(self, payload: dict, *, backward: bool) -> OpOutput:
        """forward / forward_backward: loss, metrics and per-token outputs; backward=True
        accumulates gradients until the next optim_step. A non-finite loss, output, metric or
        accumulated gradient fails it with the gradients as they were before."""
        self.require_trainable("forward_backward" if backward else "forward")
        request = validation.forward_request(payload, self.role, self.cfg)
        ids, inputs, lengths = collate(request.data)
        if self.role == "critic":
            loss_function, key = losses.ppo_critic, "values"
        else:
            loss_function, key = losses.POLICY[request.loss], "logprobs"

        def loss_of(per_token: Tensor) -> losses.Result:
            return loss_function(per_token, inputs, request.config)

        saved = self.saved_grads() if backward else {}
        try:
            with torch.no_grad():
                per_token = self.token_outputs(
                    ids, inputs.get("target_tokens"), lengths, loss_of if backward else None
                )
                loss, metrics = loss_of(per_token)
            require_finite("loss", loss)
            require_finite(key, per_token)
            if not all_finite(metrics.values()):
                raise non_finite("metrics")
            if backward:
                require_finite("gradients", *self.grads())
        except BaseException:
            if backward:
                self.restore_grads(saved)
            raise
        outputs = [{key: per_token[i, :n].tolist()} for i, n in enumerate(lengths)]
        tokens = sum(lengths)
        usage = {"tokens": tokens} | ({"trained_tokens": tokens} if backward else {})
        return OpOutput({"loss": loss.item(), "metrics": metrics, "outputs": outputs}, usage)

    def grads(self) -> list[Tensor]:
        """The accumulated gradients (parameters without one have none yet)."""
        return [p.grad for p in self.trainable_parameters().values() if p.grad is not None]

    def saved_grads(self) -> dict[str, Tensor | None]:
        """A copy of the accumulated gradients, for `restore_grads`."""
        return {
            n: None if p.grad is None else p.grad.clone()
            for n, p in self.trainable_parameters().items()
        }

    def restore_grads(self, saved: dict[str, Tensor | None]) -> None:
        for name, param in self.trainable_parameters().items():
            param.grad = saved[name]

    def token_outputs(
        self,
        ids: Tensor,
        targets: Tensor | None,
        lengths: list[int],
        loss_of: Callable[[Tensor], losses.Result] | None = None,
    ) -> Tensor:
        """Per-token logprobs of the targets (policy) or values (critic) [B, T]. Datums run in
        chunks of similar length, to pad less; every chunking gives the same bits. With the
        batch's `loss_of`, each chunk's gradients are accumulated as soon as it is computed, so
        one chunk's activations are kept at a time: a loss is a sum over datums of terms of the
        datum's own row (docs/losses.md), so the gradient at a chunk's rows is the same whatever
        the other rows hold (the chunks not yet computed hold 0 meanwhile)."""
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        layers = self.layers()
        per_token = torch.zeros(ids.shape, dtype=torch.float32)
        for chunk in forward_chunks(order, lengths):
            rows, width = torch.tensor(chunk), max(lengths[i] for i in chunk)
            recompute = loss_of is not None and (
                activation_bytes(self.cfg, len(chunk) * width) > SAVED_ACTIVATIONS
            )
            check = memory.releasing(self.check_interrupt) if recompute else self.check_interrupt
            check()
            with torch.enable_grad() if loss_of is not None else torch.no_grad():
                hidden = self.model.hidden(
                    ids[rows, :width], layers=layers, check=check, recompute=recompute
                )
                if self.role == "critic":
                    weight = self.value_head["value_head.weight"]
                    values = ExactLinear.apply(hidden, exact.weight(weight), weight)
                    part = (values + self.value_head["value_head.bias"]).squeeze(-1)
                else:
                    part = self.model.target_logprobs(hidden, targets[rows, :width], check)
                part = F.pad(part, (0, ids.shape[1] - width))
                if loss_of is not None:
                    loss, _ = loss_of(per_token.index_put((rows,), part))
                    loss.backward()
            per_token[rows] = part.detach()
        return per_token

    def layers(self) -> list[LayerWeights]:
        """The trainer's fixed-point merged weights, built once per weights version (the adapter
        changes only with one: optim_step, load_state) and reused by every forward until then."""
        version = self.weights_version
        layers = self.trainer_layers_of(version)
        if layers is None:
            self.trainer_layers = None  # free the old ones before building the new
            sampler = self.sampler_models.get(version)
            same_base = self.snapshot_bases.get(version) is self.base_weights
            built = sampler.frozen if sampler is not None and same_base else None
            layers = self.model.layer_weights(built)
            self.trainer_layers = (version, self.model, layers)
        return layers

    def trainer_layers_of(self, version: int) -> list[LayerWeights] | None:
        """The trainer's built layers if they are those of weights `version`, else None."""
        cached = self.trainer_layers
        if cached is None or cached[0] != version or cached[1] is not self.model:
            return None
        return cached[2]

    def optim_step(self, optimizer: dict) -> OpOutput:
        """One AdamW update from the accumulated gradients; clears them. A non-finite grad norm,
        parameter or moment fails it with everything (step and gradients too) as before."""
        self.require_trainable("optim_step")
        hp = validation.hyperparameters(optimizer)
        saved = self.optimizer.saved()
        grad_norm = self.optimizer.step(hp)
        if not (math.isfinite(grad_norm) and self.optimizer.finite()):
            self.optimizer.restore(saved)
            raise non_finite("parameters, optimizer moments or grad norm")
        self.step += 1
        self.weights_version += 1
        metrics = {"grad_norm": grad_norm, "learning_rate": hp["learning_rate"]}
        return OpOutput({"step": self.step, "metrics": metrics}, {"tokens": 0})

    # --- samplers -------------------------------------------------------------------------

    def save_weights_for_sampler(self, sampler_id: str) -> OpOutput:
        """Snapshot the adapter under sampler_id: later training does not change it."""
        self.require_policy("save_weights_for_sampler")
        if sampler_id in self.samplers:
            raise InvalidRequest(f"sampler_id {sampler_id!r} already exists")
        if self.weights_version not in self.snapshots:  # unchanged weights share one snapshot
            self.snapshots[self.weights_version] = self.lora.snapshot()
            self.snapshot_bases[self.weights_version] = self.base_weights
        self.samplers[sampler_id] = self.weights_version
        return OpOutput({"sampler_id": sampler_id}, {"tokens": 0})

    def write_sampler(self, sampler_id: str, path: Path) -> None:
        """Persist the sampler's snapshot (what a restarted server reads back)."""
        checkpoint.save_sampler(path, self.snapshots[self.samplers[sampler_id]])

    def read_sampler(self, sampler_id: str, path: Path) -> None:
        """Publish `sampler_id` from a snapshot `write_sampler` wrote. Its weights version is
        negative: a snapshot read from disk, not one of this run's live versions."""
        self.require_policy("save_weights_for_sampler")
        version = min([0, *self.snapshots]) - 1
        self.snapshots[version] = checkpoint.load_sampler(path)
        self.snapshot_bases[version] = self.base_weights
        self.samplers[sampler_id] = version

    def sampler_model(self, sampler_id: str) -> Llama:
        """The snapshot's merged sampling copy (W + scale * B @ A), built on first use. Only
        the sampler operations call it (the server's sampler lane, beside the training one):
        a snapshot and its base never change once published."""
        self.require_policy("sampler operation")
        if sampler_id not in self.samplers:
            raise NotFound(f"sampler_id {sampler_id!r} does not exist in this run")
        version = self.samplers[sampler_id]
        if version not in self.sampler_models:
            self.sampler_models[version] = self.new_sampler_model(version)
            while len(self.sampler_models) > SAMPLER_MODELS_KEPT:
                self.sampler_models.popitem(last=False)
        self.sampler_models.move_to_end(version)
        return self.sampler_models[version]

    def new_sampler_model(self, version: int) -> Llama:
        """The frozen model of a snapshot: the trainer's fixed-point layers and head where it has
        built them for this weights version on this base (the same merged weights, the merge
        being exact), else its own from the snapshot merged into its base."""
        base = self.snapshot_bases[version]
        head = self.model.head if base is self.base_weights else None
        trainer = self.trainer_layers_of(version)
        if head is not None and trainer is not None:
            model = Llama(self.cfg, base, head=head)  # its projections are the trainer's layers
            model.layer_weights(trainer)
            return model
        return Llama(self.cfg, self.snapshots[version].merged(base), head=head)

    def sample(
        self,
        sampler_id: str,
        requests: list[dict],
        default_seeds: list[int],
        watch: Watch | None = None,
    ) -> list[OpOutput | WhitneyError]:
        """One SampleResult per request, all decoded together (each result is bitwise the same
        whatever else is in `requests`); a `NonFiniteResult` in place of a request whose
        sequences hold a non-finite logprob. `watch` is shown each token step as it is drawn."""
        model = self.sampler_model(sampler_id)
        specs = [
            validation.sample_spec(request, seed, self.cfg)
            for request, seed in zip(requests, default_seeds, strict=True)
        ]
        with torch.inference_mode():
            results = sample(model, specs, check=self.check_interrupt, watch=watch)
        outputs: list[OpOutput | WhitneyError] = []
        for spec, sequences in zip(specs, results, strict=True):
            if not all(all_finite(s["logprobs"]) for s in sequences):
                outputs.append(non_finite("logprobs"))
                continue
            sampled = sum(len(s["tokens"]) for s in sequences)
            prompt = len(spec.prompt)
            usage = {
                "tokens": prompt + sampled,
                "prefill_tokens": prompt,
                "sampled_tokens": sampled,
            }
            outputs.append(OpOutput({"sequences": sequences, "prompt_tokens": prompt}, usage))
        return outputs

    def logprobs(self, sampler_id: str, request: dict) -> OpOutput:
        """log p(token i | tokens before i) at temperature 1 under the snapshot; first is None.
        Bitwise the same whatever else the request holds and however a client chunks a batch."""
        model = self.sampler_model(sampler_id)
        sequences = validation.logprobs_sequences(request, self.cfg)
        order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))  # less padding
        result: list[list[float | None]] = [[None] for _ in sequences]
        with torch.inference_mode():
            for start in range(0, len(order), LOGPROBS_CHUNK):
                self.check_interrupt()
                chunk = [i for i in order[start : start + LOGPROBS_CHUNK] if len(sequences[i]) > 1]
                if not chunk:
                    continue  # a single token has no logprob to report
                width = max(len(sequences[i]) for i in chunk)
                ids = torch.zeros(len(chunk), width, dtype=torch.long)
                for row, i in enumerate(chunk):
                    ids[row, : len(sequences[i])] = torch.tensor(sequences[i])
                hidden = model.hidden(ids, check=self.check_interrupt)
                lengths = torch.tensor([len(sequences[i]) - 1 for i in chunk])
                scored = torch.arange(width - 1)[None, :] < lengths[:, None]  # not padding
                lp = torch.zeros(len(chunk), width - 1)
                lp[scored] = model.target_logprobs(
                    hidden[:, :-1][scored], ids[:, 1:][scored], self.check_interrupt
                )
                for row, i in enumerate(chunk):
                    values = lp[row, : len(sequences[i]) - 1]
                    require_finite("logprobs", values)
                    result[i] = [None, *values.tolist()]
        return OpOutput({"logprobs": result}, {"tokens": sum(len(s) for s in sequences)})

    # --- checkpoints ----------------------------------------------------------------------

    def save_state(self, directory: Path) -> OpOutput:
        """Base weights, adapter (and value head), optimizer moments and step, in `directory`."""
        self.require_trainable("save_state")
        meta = {
            "base_model": self.base_model,
            "model_config": dataclasses.asdict(self.cfg),
            "lora_rank": self.lora.rank,
            "lora_alpha": self.lora.alpha,
            "role": self.role,
            "step": self.step,
            "optimizer_t": self.optimizer.t,
        }
        params = {n: t.detach() for n, t in self.trainable_parameters().items()}
        checkpoint.save_state(
            Path(directory),
            checkpoint.Checkpoint(meta, self.base_weights, params, self.optimizer.state()),
        )
        return OpOutput({"step": self.step}, {"tokens": 0})

    def load_state(self, directory: Path, *, with_optimizer: bool = True) -> OpOutput:
        """Replace weights (base included), adapter, step and, with_optimizer, the moments."""
        self.require_trainable("load_state")
        self.restore(Path(directory), with_optimizer=with_optimizer)
        return OpOutput({"step": self.step}, {"tokens": 0})

    def restore(self, directory: Path, *, with_optimizer: bool) -> None:
        try:
            ckpt = checkpoint.load_state(directory)
        except (OSError, ValueError) as exc:
            raise InvalidRequest(f"cannot read checkpoint: {exc}") from exc
        meta = ckpt.meta
        for key, mine in (
            ("base_model", self.base_model),
            ("lora_rank", self.lora.rank),
            ("role", self.role),
        ):
            if meta[key] != mine:
                raise InvalidRequest(
                    f"checkpoint {key} {meta[key]!r} does not match the run's {mine!r}",
                )
        require_finite(
            "checkpoint weights or moments",
            *ckpt.base_weights.values(),
            *ckpt.adapter.values(),
            *ckpt.optimizer.values(),
        )
        self.cfg = ckpt.config
        self.base_weights = shared_if_equal(self.base_key, ckpt.base_weights)
        self.model = Llama(self.cfg, self.base_weights, self.lora)
        with torch.no_grad():
            for name, param in self.trainable_parameters().items():
                param.copy_(ckpt.adapter[name])
                param.grad = None
        if with_optimizer:
            self.optimizer.load(ckpt.optimizer, meta["optimizer_t"])
        else:
            self.optimizer = AdamW(self.trainable_parameters())
        self.step = meta["step"]
        self.weights_version += 1

    def export_lora(self, archive_path: Path) -> OpOutput:
        """The adapter in PEFT layout plus the base weights, as one deterministic tar archive."""
        self.require_trainable("export_lora")
        sha256, size = checkpoint.export_lora(
            Path(archive_path),
            base_model=self.base_model,
            cfg=self.cfg,
            base_weights=self.base_weights,
            lora=self.lora,
            extra={n: t.detach() for n, t in self.value_head.items()} or None,
        )
        return OpOutput({"format": "peft", "sha256": sha256, "bytes": size}, {"tokens": 0})
