"""The failure handling the small flow configs of the tests share (RL, SFT, distillation):
quick task retries, one retry of a failed cycle, a short cleanup."""

from __future__ import annotations

from typing import Any

from tasks.retry import TaskRetrySettings

QUICK_RECOVERY: dict[str, Any] = {
    "task_retry": TaskRetrySettings(retries=3, delay_s=0.05, max_delay_s=0.5, jitter=0.2),
    "cycle_retries": 1,
    "cleanup_timeout_s": 30,
}
