"""A flow's plan built once per process: the CLI checks a config before Prefect starts, the
flow checks it again before anything is allocated, and every cycle subflow needs it; all of
them in one process share the plan the first built. A plan is a pure function of its config
(recipe, environment, renderer, data) and of the registries and plug-ins it loads, which do
not change while a process runs, so sharing it changes nothing but the time.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from functools import wraps
from typing import TypeVar

from pydantic import BaseModel

C = TypeVar("C", bound=BaseModel)
P = TypeVar("P")
KEPT = 8
"""Plans kept per builder (a test session runs many configs in one process)."""
_caches: list[OrderedDict] = []


def once_per_process(build: Callable[[C], P]) -> Callable[[C], P]:
    """`build`, remembered per config (by its type and JSON): a config's plan is built the
    first time it is asked for in this process; a failed build (ConfigError) is not kept."""
    plans: OrderedDict[tuple[type, str], P] = OrderedDict()
    _caches.append(plans)
    lock = threading.Lock()

    @wraps(build)
    def plan_of(config: C) -> P:
        key = (type(config), config.model_dump_json())
        with lock:
            if key in plans:
                plans.move_to_end(key)
                return plans[key]
        plan = build(config)
        with lock:
            plans[key] = plan
            while len(plans) > KEPT:
                plans.popitem(last=False)
        return plan

    return plan_of


def forget_plans() -> None:
    """Forget every plan built so far (for tests that change a registry a plan reads, such
    as the recipes or a plug-in environment)."""
    for plans in _caches:
        plans.clear()
