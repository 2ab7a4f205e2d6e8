"""The DPO flow: preference pairs trained through the importance-sampling gradient, one
subflow run per cycle (the outer loop: flows.core.loop.cycles).

    dpo_flow(config)                      check the config, the pairs and the reference (fail
                                          closed), resume point, open_session (labelled),
                                          create the policy run and the frozen reference run
      [policy: load_state reference]      a checkpoint reference: the policy starts from it
      reference: save_weights_for_sampler `reference` + one logprobs per chunk of pairs
                                          (once per pair: train and held-out)
      cycle-{first} .. cycle-{n-1}        dpo_cycle(config, cycle, start), unless the budget
                                          says stop
        [forward ...]                     held-out pairs before the flow run's first cycle
        forward                           the policy's logprobs of the batch's answers
        margins, DPO loss and weights     flows.dpo.objective (in the flow)
        forward_backward                  importance_sampling: the answers with the forward
                                          logprobs as sampling logprobs (ratio 1) and
                                          advantages +weight (chosen) / -weight (rejected)
        optim_step, [save_state cycle-{n}]  (the training tail every flow shares: run_tail)
        [forward ...]                     held-out pairs after the step, every eval_every
      save_state cycle-{n-1}, export_lora, finish both runs, close_session

At ratio exactly 1 the importance_sampling gradient, -sum_t A_t grad lp_t, is the DPO
gradient. That needs the `forward` logprobs and the ones `forward_backward` computes to be the
same bits: the embedded engine's are (docs/engine.md); `kl_sample_train` records it (0.0).
Every operation has an explicit seq id from the cycle's ledger, so a retried cycle replays and
a retried or resumed flow run continues from a `cycle-{n}` checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence

from prefect import flow, get_run_logger
from pydantic import BaseModel

from blocks.endpoint import resolve_connection
from flows.core.config import checkpoint_due
from flows.core.evaluation.plan import completion_logprobs
from flows.core.loop.budget import BudgetGuard, flow_cost_model
from flows.core.loop.context import CycleContext, sampler_calls
from flows.core.loop.cost import usage_of
from flows.core.loop.cycles import CycleStart, cycle_subflow, run_cycles
from flows.core.loop.training import end_training_run, start_training_run
from flows.core.orchestration.cleanup import CLEANUP_HOOKS
from flows.core.records.run_records import run_rows, spend_rows
from flows.dpo.config import BASE_REFERENCE, DPOConfig
from flows.dpo.metrics import DPOCycleMetrics, DPOResult, PreferenceEval, learning_curves
from flows.dpo.objective import PairLogprobs, margin, preference_stats
from flows.dpo.pairs import PairTokens
from flows.dpo.plan import (
    FORWARD_LOSS,
    LOSS_FUNCTION,
    DPOPlan,
    answer_logprobs,
    check_dpo_config,
    forward_datums,
    training_datums,
)
from flows.dpo.reference import check_reference
from tasks.names import cycle_name
from tasks.operations import SequencedClient
from whitney import wire
from whitney.payloads import adamw_optimizer, forward_backward_payload

ROLE_LABEL = "whitney-flows.role"
REFERENCE_SAMPLER = "reference"
Sums = tuple[float, float]
"""A pair's summed answer logprobs: (chosen, rejected)."""


class ReferenceLogprobs(BaseModel):
    """The frozen reference's summed answer logprobs of every pair, in the plan's order."""

    train: list[Sums]
    eval: list[Sums]


def reference_logprobs(client: SequencedClient, run_id: str, plan: DPOPlan) -> ReferenceLogprobs:
    """The reference run's sampler `reference` and one `logprobs` call per chunk of pairs
    (submitted together): each answer's summed logprobs."""
    pairs = [*plan.train, *plan.eval]
    size = plan.config.chunk_size
    payloads = [
        {"sequences": [{"token_ids": s} for p in pairs[i : i + size] for s in p.sequences()]}
        for i in range(0, len(pairs), size)
    ]
    results = sampler_calls(
        client, run_id, REFERENCE_SAMPLER, "logprobs", payloads, True, publish=True
    )
    rows = [row for result in results for row in result["logprobs"]]
    sums = []
    for index, pair in enumerate(pairs):
        chosen, rejected = rows[2 * index], rows[2 * index + 1]
        sums.append(
            (
                sum(completion_logprobs(chosen, len(pair.prompt), len(pair.chosen))),
                sum(completion_logprobs(rejected, len(pair.prompt), len(pair.rejected))),
            )
        )
    return ReferenceLogprobs(train=sums[: len(plan.train)], eval=sums[len(plan.train) :])


def policy_logprobs(
    ctx: CycleContext, pairs: Sequence[PairTokens], chunk_size: int
) -> list[list[float]]:
    """The policy's logprobs of each pair's chosen then rejected answer tokens: `forward`
    (no gradient) on the context's policy run per chunk of `chunk_size` pairs."""
    rows: list[list[float]] = []
    for start in range(0, len(pairs), chunk_size):
        data = forward_datums(pairs[start : start + chunk_size])
        payload = forward_backward_payload(data, FORWARD_LOSS)
        operation = ctx.client.execute(ctx.run_id, "forward", payload)
        rows += answer_logprobs(operation.result_as(wire.ForwardResult).outputs, data)
    return rows


def pair_logprobs(rows: Sequence[list[float]], reference: Sequence[Sums]) -> list[PairLogprobs]:
    """Each pair's policy sums (from `rows`, chosen then rejected) beside its reference's."""
    return [
        PairLogprobs(sum(rows[2 * i]), sum(rows[2 * i + 1]), chosen, rejected)
        for i, (chosen, rejected) in enumerate(reference)
    ]


def evaluate(ctx: CycleContext, plan: DPOPlan, reference: ReferenceLogprobs) -> PreferenceEval:
    """The held-out pairs' DPO numbers under the policy's current weights."""
    rows = policy_logprobs(ctx, plan.eval, plan.config.chunk_size)
    config = plan.config
    stats = preference_stats(
        pair_logprobs(rows, reference.eval), config.beta, config.label_smoothing
    )
    return PreferenceEval.of(stats)


def run_dpo_cycle(
    plan: DPOPlan, ctx: CycleContext, reference: ReferenceLogprobs
) -> DPOCycleMetrics:
    """One DPO cycle, every call through the context's client (the cycle's ledger)."""
    clock = ctx.clock()
    config = plan.config
    client, cycle, first_cycle = ctx.client, ctx.cycle, ctx.first_cycle
    eval_before = None
    if cycle == first_cycle and plan.eval_due(cycle):
        eval_before = evaluate(ctx, plan, reference)
    indices = plan.batch(cycle)
    pairs = [plan.train[i] for i in indices]
    rows = policy_logprobs(ctx, pairs, config.chunk_size)
    logprobs = pair_logprobs(rows, [reference.train[i] for i in indices])
    stats = preference_stats(logprobs, config.beta, config.label_smoothing)
    margins = [margin(pair, config.beta) for pair in logprobs]
    payload = forward_backward_payload(training_datums(config, pairs, rows, margins), LOSS_FUNCTION)
    optimizer = adamw_optimizer(config.learning_rate, grad_clip_norm=config.grad_clip_norm)
    checkpoint = checkpoint_due(cycle, config.checkpoint_every, config.cycles)
    tail = ctx.run_tail(payload, optimizer, checkpoint=checkpoint)
    evaluation = None
    if plan.eval_due(cycle + 1):
        evaluation = evaluate(ctx, plan, reference)
    log = client.log
    return DPOCycleMetrics(
        **clock.fields(ctx),
        loss=stats.loss,
        reward_accuracy=stats.accuracy,
        margin=stats.margin,
        chosen_reward=stats.chosen_reward,
        rejected_reward=stats.rejected_reward,
        chosen_drift=stats.chosen_drift,
        rejected_drift=stats.rejected_drift,
        kl_sample_train=tail.backward.metrics.get("kl_sample_train:mean"),
        grad_norm=tail.optimized.metrics.get("grad_norm", 0.0),
        pairs=len(pairs),
        tokens_trained=log.tokens("forward_backward", "trained_tokens"),
        checkpoint=tail.checkpoint,
        usage=usage_of(log.operations),
        eval_before=eval_before,
        eval=evaluation,
    )


@cycle_subflow("dpo-cycle")
def dpo_cycle(
    config: DPOConfig,
    cycle: int,
    start: CycleStart,
    whitney_block: str | None = None,
    run_id: str = "",
    reference: ReferenceLogprobs | None = None,
) -> DPOCycleMetrics:
    """One DPO cycle of the policy `run_id` from `start`, against the reference's summed
    logprobs `reference`; returns its metrics, with where the next cycle starts."""
    plan = check_dpo_config(config)  # built once per process (flows.core.loop.plans)
    if reference is None:
        raise ValueError("a DPO cycle needs the reference's logprobs")
    ctx = CycleContext.open(config, cycle, start, whitney_block, run_id)
    return ctx.finish(run_dpo_cycle(plan, ctx, reference), {run_id: "policy"})


def summary_rows(result: DPOResult) -> list[tuple[str, str]]:
    """The DPO summary's rows: the held-out accuracy before and after, the last cycle's loss
    and margin, tokens and cost, then the run's whereabouts."""
    rows = [("cycles", str(len(result.cycles))), ("reference", f"`{result.reference}`")]
    for when, evaluation in (("before", result.eval_before), ("after", result.eval_after)):
        if evaluation is not None:
            rows.append((f"held-out accuracy, {when}", f"{evaluation.accuracy:.3f}"))
            rows.append(
                (f"held-out chosen preferred, {when}", f"{evaluation.chosen_preferred:.3f}")
            )
    if result.cycles:
        last = result.cycles[-1]
        rows.append(("DPO loss, last cycle", f"{last.loss:.4f}"))
        rows.append(("margin, last cycle", f"{last.margin:.4f}"))
    rows += spend_rows(result)
    rows.append(("reference run", f"`{result.reference_run_id}`"))
    return rows + run_rows(result)


@flow(name="dpo", persist_result=False, **CLEANUP_HOOKS)
def dpo_flow(config: DPOConfig, whitney_block: str | None = None) -> DPOResult:
    """Train a LoRA adapter by DPO on preference pairs on Whitney: check the config, the
    pairs and the reference, open a labelled session with a policy and a frozen reference
    run, score every pair once on the reference, run the cycle subflows within the budget,
    then save_state, export_lora, finish, close.

    Args:
        config: The DPO configuration: the pairs, the reference, beta and the options.
        whitney_block: The WhitneyCredentials block of the Whitney to train on; empty:
            api_url or WHITNEY_API_URL, and the key in WHITNEY_API_KEY.
    """
    plan = check_dpo_config(config)  # fails closed before anything is allocated
    connection = resolve_connection(config.api_url, whitney_block)
    check_reference(config, connection)
    guard = BudgetGuard(config.budget, flow_cost_model(config.prices, whitney_block))
    training = start_training_run(config, connection, "policy", {ROLE_LABEL: "policy"})
    start, policy = training.start, training.run_id
    reference_checkpoint = None if config.reference == BASE_REFERENCE else config.reference
    frozen = training.add_run(
        "reference",
        trainable=False,
        from_checkpoint=reference_checkpoint,
        labels={ROLE_LABEL: "reference"},
    )
    client = training.client({policy: training.next_seq_id, frozen.run_id: frozen.next_seq_id})
    if reference_checkpoint is not None and start.checkpoint is None:
        payload = {"checkpoint": reference_checkpoint, "with_optimizer": False}
        client.execute(policy, "load_state", payload)
    reference = reference_logprobs(client, frozen.run_id, plan)
    get_run_logger().info(
        "Policy run %s, reference run %s (%s): %d training pairs, %d held out, cycles %d..%d",
        policy,
        frozen.run_id,
        config.reference,
        len(plan.train),
        len(plan.eval),
        start.first_cycle,
        config.cycles - 1,
    )
    guard.add(usage_of(client.log.operations))
    counted = len(client.log.operations)
    ran = run_cycles(
        dpo_cycle,
        config,
        range(start.first_cycle, config.cycles),
        {policy: client.ledger.position(policy)},
        whitney_block,
        guard=guard,
        run_id=policy,
        reference=reference,
    )
    client.ledger.move_to(policy, ran.seq_ids[policy])
    last_cycle = ran.last.cycle if ran.last is not None else start.first_cycle - 1
    final_name = cycle_name(last_cycle) if last_cycle >= 0 else None
    final = end_training_run(training, client, final_name, [frozen.run_id])
    guard.add(usage_of(client.log.operations[counted:]))
    cycles = ran.records.cycles
    evaluated = [metrics.eval for metrics in cycles if metrics.eval is not None]
    result = DPOResult(
        **dict(final),
        reference_run_id=frozen.run_id,
        reference=reference_checkpoint or f"base:{config.base_model}",
        cycles=cycles,
        eval_before=cycles[0].eval_before if cycles else None,
        eval_after=evaluated[-1] if evaluated else None,
        total_tokens=guard.tokens,
        cost=guard.cost,
        budget_stop=guard.stopped,
    )
    ran.records.add_markdown_summary(
        "DPO flow summary",
        summary_rows(result),
        "Held-out preference accuracy, DPO loss, checkpoint and adapter of the DPO run",
        learning_curves(cycles),
    )
    return result
