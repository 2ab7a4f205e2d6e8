"""The parent run of the fork and manifest tests: 4 RL cycles on local/tiny, a checkpoint
after each of cycles 0..2 (the final one is cycle-3), an inline evaluation after cycles 1
and 3; trained once per test session and server."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from flowtest_rl import small_rl_config

from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from flows.rl.metrics import RLResult


@dataclass(frozen=True)
class Parent:
    config: RLConfig
    result: RLResult
    flow_run_id: UUID

    def checkpoint(self, cycle: int) -> str:
        return f"whitney://runs/{self.result.run_id}/states/cycle-{cycle}"


_parents: dict[str, Parent] = {}


def parent_config(api_url: str) -> RLConfig:
    return small_rl_config(
        api_url,
        base_model="local/tiny",
        cycles=4,
        checkpoint_every=1,
        eval_every=2,
        prompts_per_cycle=2,
        max_tokens=6,
        seed=5,
    )


def parent_run(api_url: str) -> Parent:
    """The parent run on the server at `api_url` (its key in WHITNEY_API_KEY)."""
    if api_url not in _parents:
        config = parent_config(api_url)
        state = rl_flow(config, return_state=True)
        assert state.is_completed(), state.message
        _parents[api_url] = Parent(config, state.result(), state.state_details.flow_run_id)
    return _parents[api_url]
