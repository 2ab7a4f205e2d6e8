"""`ServedModels`: what a `model` of the OpenAI-compatible routes names, and the frozen engine
that samples it.

A `model` is a base model the server serves (`local/tiny`, a cached repo id), a run's sampler
(`whitney://runs/<run_id>/samplers/<sampler_id>`) or a checkpoint
(`whitney://runs/<run_id>/states/<name>`), of the caller's tenant. Each is sampled on its own
frozen `EngineRun` holding one sampler snapshot (a base model's is its untrained adapter, whose
update is zero; a sampler's is the snapshot the run wrote; a checkpoint's is its adapter), so
no request enters a run's ordered operations, and every answer comes from the engine's own
`sample`: the bits a Whitney `sample` of the same snapshot gives. The engines of the most
recently used models are kept; one request samples an engine at a time.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any

from whitney import hf_cache
from whitney.errors import InvalidRequest, NotFound, WhitneyError
from whitney.local import hf_models
from whitney.local.config import ServerConfig
from whitney.local.files import RunFiles
from whitney.local.journal import Journal
from whitney.local.names import valid_name
from whitney.local.runs import load_engine
from whitney.renderers import AUTO, Renderer, get_renderer
from whitney.tokenizers import HF_PREFIX, Tokenizer, get_tokenizer
from whitney.uris import checkpoint_uri, sampler_uri, split_checkpoint, split_sampler

log = logging.getLogger("whitney.local.openai")

ENGINES_KEPT = 2
SNAPSHOT = "served"  # the sampler id of a served engine's one snapshot


@dataclass
class ServedModel:
    """A model ready to sample: its frozen engine, tokenizer and renderer."""

    name: str
    base_model: str
    engine: Any  # whitney.local.engine.EngineRun, frozen, with the snapshot SNAPSHOT
    tokenizer: Tokenizer
    renderer: Renderer
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def max_positions(self) -> int:
        return int(self.engine.cfg.max_positions)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return tuple(self.engine.cfg.eos_token_ids)

    def sample(
        self,
        payloads: list[dict[str, Any]],
        seeds: list[int],
        cancel: threading.Event,
        on_step: Callable[..., Collection[int]],
        top: int,
    ) -> list[Any]:
        """The engine's `sample` of `payloads` (one SampleResult's OpOutput each, decoded
        together), `on_step(rows, tokens, logprobs, top, ends)` called at each token step
        (the engine's `Watch`: it returns the rows to end); `cancel` set stops it
        (OperationCancelled)."""
        watch = load_engine().Watch(
            lambda s: on_step(s.rows, s.tokens, s.logprobs, s.top, s.ends), top
        )
        outputs = self._run(cancel, lambda: self.engine.sample(SNAPSHOT, payloads, seeds, watch))
        for output in outputs:
            if isinstance(output, WhitneyError):
                raise output
        return outputs

    def _run(self, cancel: threading.Event, call: Callable[[], Any]) -> Any:
        with self.lock:
            self.engine.interrupt = cancel
            try:
                return call()
            finally:
                self.engine.interrupt = threading.Event()


class ServedModels:
    """The models each tenant may name, and their engines (the last ENGINES_KEPT used)."""

    def __init__(self, config: ServerConfig, journal: Journal, files: RunFiles) -> None:
        self.config = config
        self.journal = journal
        self.files = files
        self._engines: OrderedDict[str, ServedModel] = OrderedDict()
        self._lock = threading.Lock()
        self._building: dict[str, threading.Lock] = {}
        self.cancelled = 0  # requests stopped because their client went away

    def base_models(self) -> list[str]:
        engine = load_engine()
        return [*engine.BASE_MODELS, *hf_models.served_repo_ids(self.config.hf_cache)]

    def list(self, tenant: str) -> list[dict[str, Any]]:
        """The `data` of `GET /v1/models`: base models, then the tenant's samplers and
        checkpoints, oldest first."""
        models = [{"id": name, "owned_by": "whitney"} for name in self.base_models()]
        for row in self.journal.tenant_samplers(tenant):
            if self.files.sampler_path(row["run_id"], row["sampler_id"]).is_file():
                uri = sampler_uri(row["run_id"], row["sampler_id"])
                models.append({"id": uri, "owned_by": row["run_id"]})
        for row in self.journal.tenant_checkpoints(tenant):
            uri = checkpoint_uri(row["run_id"], row["name"])
            models.append({"id": uri, "owned_by": row["run_id"]})
        return [{"object": "model", "created": 0, **model} for model in models]

    def get(self, tenant: str, name: str) -> ServedModel:
        """The model `name` of `tenant`, its engine built on first use; 404 naming `model`
        for a name that is not one (another tenant's sampler or checkpoint included)."""
        build = self._resolve(tenant, name)
        with self._lock:
            served = self._engines.get(name)
            if served is not None:
                self._engines.move_to_end(name)
                return served
            building = self._building.setdefault(name, threading.Lock())
        with building:
            with self._lock:
                served = self._engines.get(name)
            if served is None:
                served = build()
                with self._lock:
                    self._engines[name] = served
                    while len(self._engines) > ENGINES_KEPT:
                        self._engines.popitem(last=False)
        return served

    def _resolve(self, tenant: str, name: str) -> Any:
        """A function building the model `name` (checked to be the tenant's first)."""
        engine = load_engine()
        hf_cache = self.config.hf_cache
        if name in self.base_models():

            def base() -> ServedModel:
                run = engine.EngineRun.create(
                    base_model=name, lora_rank=1, seed=0, trainable=False, hf_cache=hf_cache
                )
                run.save_weights_for_sampler(SNAPSHOT)
                return self._served(name, name, run)

            return base
        sampler = split_sampler(name)
        if sampler is not None and valid_name(sampler[1]):
            run_id, sampler_id = sampler
            record = self._own_run(tenant, run_id, name)
            path = self.files.sampler_path(run_id, sampler_id)
            if not path.is_file():
                raise _no_model(name)

            def from_sampler() -> ServedModel:
                run = self._frozen(engine, record)
                run.read_sampler(SNAPSHOT, path)
                return self._served(name, record["base_model"], run)

            return from_sampler
        if split_checkpoint(name) is not None:
            try:
                directory = self.files.resolve_checkpoint(tenant, name, field="model")
            except NotFound:
                raise _no_model(name) from None
            record = self._own_run(tenant, split_checkpoint(name)[0], name)  # type: ignore[index]
            if record["role"] != "policy":
                raise InvalidRequest(
                    f"model: {name!r} is a critic's checkpoint: it has no sampler",
                    details={"field": "model"},
                )

            def from_checkpoint() -> ServedModel:
                run = self._frozen(engine, record, directory)
                run.save_weights_for_sampler(SNAPSHOT)
                return self._served(name, record["base_model"], run)

            return from_checkpoint
        raise _no_model(name)

    def _own_run(self, tenant: str, run_id: str, name: str) -> dict[str, Any]:
        record = self.journal.get_run(run_id)
        if record is None or record["tenant"] != tenant:
            raise _no_model(name)
        return record

    def _frozen(self, engine: Any, record: dict[str, Any], directory: Any = None) -> Any:
        return engine.EngineRun.create(
            base_model=record["base_model"],
            lora_rank=record["lora_rank"],
            seed=record["seed"],
            trainable=False,
            checkpoint_dir=directory,
            hf_cache=self.config.hf_cache,
        )

    def _served(self, name: str, base_model: str, run: Any) -> ServedModel:
        """`run` with its tokenizer and renderer: a built-in model's bytes and raw renderer,
        else the Hugging Face tokenizer (from the server's cache, as the engine's weights)
        and its chat template (named `hf:`, so that a repo id such as `local/SmolLM2-...` is
        not taken for a built-in `local/*`)."""
        if base_model in load_engine().BASE_MODELS:
            tokenizer = get_tokenizer(base_model)
            return ServedModel(
                name, base_model, run, tokenizer, get_renderer(AUTO, tokenizer, base_model)
            )
        source = base_model.removeprefix(HF_PREFIX)
        directory = (
            source if source.startswith("/") else hf_cache.snapshot(source, self.config.hf_cache)
        )
        try:
            tokenizer = get_tokenizer(HF_PREFIX + source, tokenizer=str(directory or source))
        except ValueError:
            log.exception("the tokenizer of %s cannot be loaded", base_model)
            raise InvalidRequest(
                f"model: the tokenizer of {base_model!r} cannot be loaded on this server",
                details={"field": "model"},
            ) from None
        renderer = get_renderer(AUTO, tokenizer, HF_PREFIX + source)
        return ServedModel(name, base_model, run, tokenizer, renderer)

    def cancelled_one(self) -> None:
        with self._lock:
            self.cancelled += 1


def _no_model(name: str) -> NotFound:
    return NotFound(
        f"model: {name!r} not found (GET /v1/models lists the models this key may use)",
        details={"field": "model"},
    )
