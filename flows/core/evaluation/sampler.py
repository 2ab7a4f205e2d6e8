"""An evaluation as ordered Whitney calls: the weights snapshotted on a sampler of their own,
then every request of the eval set on it, one block of seq ids submitted together.

    save_weights_for_sampler   named (`eval-{n}` inline, `eval` on a frozen run)
    sample x prompts           greedy (top_k 1), one completion each
    sample x prompts           k completions each at the temperature
    [logprobs x chunks]        the held-out SFT pairs, for the eval loss

A sampler snapshot changes no weight and `sample` / `logprobs` change nothing, so an inline
evaluation leaves training as it was: the adapter is the same with and without it. Its seq
ids come from the cycle's ledger and its seeds from the settings, so a replayed cycle makes
the same calls with the same ids.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from flows.core.evaluation.plan import EvalMetrics, EvalPlan, eval_due
from flows.core.loop.cost import usage_of
from tasks.names import START_EVAL_SAMPLER, eval_sampler_name
from tasks.operations import Call, SequencedClient

if TYPE_CHECKING:
    from flows.core.loop.context import CycleContext


def evaluate_weights(
    client: SequencedClient, run_id: str, sampler_name: str, plan: EvalPlan
) -> EvalMetrics:
    """The run's current weights on a sampler named `sampler_name`, evaluated by `plan`."""
    greedy, sampled = plan.requests()
    payloads = plan.logprobs_payloads()
    calls = [Call("save_weights_for_sampler", {"name": sampler_name})]
    calls += [Call("sample", request, sampler_name) for request in greedy + sampled]
    calls += [Call("logprobs", payload, sampler_name) for payload in payloads]
    results = [operation.result or {} for operation in client.run_block(run_id, calls)[1:]]
    count = len(greedy)
    rows = [row for result in results[2 * count :] for row in result["logprobs"]]
    return plan.score(results[:count], results[count : 2 * count], rows)


def evaluate_after_cycle(
    ctx: CycleContext, every: int, cycles: int, plan: EvalPlan | None
) -> dict[str, Any]:
    """The inline evaluation of the policy run after the context's cycle when one is due
    (`eval_due`), as an update of the cycle's metrics: its `eval`, and where the run's seq ids
    and the cycle's billed usage now stand. Empty when none is due (or `plan` is None). Call
    it once the cycle's training numbers are taken, so they count training alone."""
    if plan is None or not eval_due(ctx.cycle, every, cycles):
        return {}
    started = time.perf_counter()
    evaluation = evaluate_weights(ctx.client, ctx.run_id, eval_sampler_name(ctx.cycle), plan)
    return {
        "eval": evaluation.model_copy(update={"seconds": time.perf_counter() - started}),
        "seq_end": ctx.client.ledger.position(ctx.run_id),
        "usage": usage_of(ctx.client.log.operations),
    }


def evaluate_at_start(ctx: CycleContext, plan: EvalPlan) -> EvalMetrics:
    """The inline evaluation of the policy run's weights before the first cycle trains (on a
    fresh run, the base model), on the sampler `eval-start`."""
    started = time.perf_counter()
    evaluation = evaluate_weights(ctx.client, ctx.run_id, START_EVAL_SAMPLER, plan)
    return evaluation.model_copy(update={"seconds": time.perf_counter() - started})
