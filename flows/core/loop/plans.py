"""A flow's plan built once per process: the CLI checks a config before Prefect starts, the
flow checks it again before anything is allocated, and every cycle subflow needs it; all of
them in one process share the plan the first built.

The fields that say only where a run goes and writes (`WIRING`: the CLI sets them after its
check) do not count: a config differing only there shares the plan, holding its own config.
A plan is a pure function of its config (recipe, environment, renderer, data) and of the
registries and plug-ins it loads, which do not change while a process runs, so sharing it
changes nothing but the time.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from functools import wraps
from typing import Any, TypeVar

from pydantic import BaseModel

C = TypeVar("C", bound=BaseModel)
P = TypeVar("P")
WIRING = {"api_url", "metrics_path"}
"""Config fields no plan reads: where the run's Whitney is, where its metrics go."""
KEPT = 8
"""Plans kept per builder (a test session runs many configs in one process)."""
_caches: list[OrderedDict] = []


def once_per_process(build: Callable[[C], P]) -> Callable[[C], P]:
    """`build`, remembered per config (by its type and JSON but `WIRING`): a config's plan
    is built the first time it is asked for in this process; a failed build (ConfigError) is
    not kept. A plan is a frozen dataclass holding its `config`."""
    plans: OrderedDict[tuple[type, str], P] = OrderedDict()
    _caches.append(plans)
    lock = threading.Lock()

    @wraps(build)
    def plan_of(config: C) -> P:
        key = (type(config), config.model_dump_json(exclude=WIRING))
        with lock:
            if key in plans:
                plans.move_to_end(key)
                return with_config(plans[key], config)
        plan = build(config)
        with lock:
            plans[key] = plan
            while len(plans) > KEPT:
                plans.popitem(last=False)
        return plan

    return plan_of


def with_config(plan: Any, config: BaseModel) -> Any:
    """The plan, holding `config` (equal to its own but for `WIRING`)."""
    return plan if plan.config == config else replace(plan, config=config)


def forget_plans() -> None:
    """Forget every plan built so far (for tests that change a registry a plan reads, such
    as the recipes or a plug-in environment)."""
    for plans in _caches:
        plans.clear()


# Deterministic seeds: the same (config seed, cycle, prompt index) always gives the same
# sampling seed, in any process, so a replayed cycle sends byte-identical sample requests.


def derive_seed(seed: int, *parts: int) -> int:
    """A 31-bit seed derived from `seed` and `parts` (e.g. cycle, prompt index) by SHA-256."""
    text = ":".join(str(value) for value in (seed, *parts))
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:4], "big") >> 1
