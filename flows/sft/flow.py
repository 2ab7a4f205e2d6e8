"""The SFT flow: the Loop building blocks' single-pass loop without sampling, one subflow run
per cycle (the outer loop: flows.core.loop.cycles).

    sft_flow(config)                      check the config and data (fail closed), resume
                                          point, open_session (labelled), create_run
      cycle-{first} .. cycle-{n-1}        sft_cycle(config, cycle, start)
        [forward[seq=k..]]                eval loss before the first step (cycle 0)
        per step s of the cycle:
          forward_backward                cross_entropy on the step's batch of sft_datums
          optim_step                      AdamW at the scheduled learning rate of step s
                                          (the training tail every flow shares:
                                          flows.core.loop.context's run_tail; with `pipelined`, the
                                          two submitted together)
          [forward ...]                   eval loss on the held-out split, every eval_every
        [save_state cycle-{n}]            every checkpoint_every cycles
      save_state cycle-{n-1}, export_lora, finish_run, close_session

A cycle is `steps_per_cycle` optimizer steps, or one epoch with `epochs`. Which examples a
step trains on and at what rate are pure functions of (config, step) (flows.sft.plan), and
every operation is a task with an explicit seq id from the cycle's ledger, so a retried cycle
replays (completed operations come back from the server's journal, the rest run once), and a
retried flow run, or one given `resume_from`, continues from a `cycle-{n}` checkpoint.
Distillation trains its teacher with `sft_flow`.

For other flows (distillation trains its teacher with `sft_flow`): `evaluate` measures the
eval loss per token through any client with `run_operation`, and `load_sft_plan(config)`
gives the built-in corpus (or a file) tokenized and split, `plan.eval_chunks()` its held-out
datums.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from prefect import flow

from blocks.endpoint import resolve_connection
from flows.core.config import checkpoint_due
from flows.core.loop.context import CycleContext
from flows.core.loop.cycles import CycleStart, cycle_subflow, run_cycles
from flows.core.loop.training import end_training_run, start_training_run
from flows.core.orchestration.cleanup import CLEANUP_HOOKS
from flows.core.records.run_records import run_rows
from flows.sft.config import SFTConfig
from flows.sft.metrics import EvalPoint, SFTCycleMetrics, SFTResult, learning_curves
from flows.sft.plan import LOSS_FUNCTION, SFTPlan, check_sft_config
from tasks.names import cycle_name
from whitney import wire
from whitney.datums import Datum
from whitney.payloads import adamw_optimizer, forward_backward_payload


def evaluate(ctx: CycleContext, chunks: Sequence[Sequence[Datum]], step: int) -> EvalPoint:
    """The eval loss per token of the policy run's current weights: `forward` (no gradient)
    on each chunk of cross_entropy datums, sum of losses over sum of `tokens:sum`."""
    loss = tokens = 0.0
    for chunk in chunks:
        payload = forward_backward_payload(list(chunk), LOSS_FUNCTION)
        operation = ctx.client.execute(ctx.run_id, "forward", payload)
        result = operation.result_as(wire.ForwardResult)
        loss += result.loss
        tokens += result.metrics["tokens:sum"]
    if tokens <= 0:
        raise ValueError("the eval datums hold no trained token")
    return EvalPoint(step=step, loss=loss / tokens, tokens=round(tokens))


def run_sft_cycle(plan: SFTPlan, ctx: CycleContext) -> SFTCycleMetrics:
    """One cycle's steps (and evals, and checkpoint), every call through the context's client
    (the cycle's ledger)."""
    clock = ctx.clock()
    config = plan.config
    client, cycle = ctx.client, ctx.cycle
    steps = plan.cycle_steps(cycle)
    evals: list[EvalPoint] = []
    if steps.start == 0 and plan.eval_due(0):
        evals.append(evaluate(ctx, plan.eval_chunks(), 0))
    loss_sum = token_sum = 0.0
    grad_norms: list[float] = []
    rate = config.learning_rate
    for step in steps:
        payload = forward_backward_payload(plan.batch(step), LOSS_FUNCTION)
        rate = plan.learning_rate(step)
        optimizer = adamw_optimizer(rate, grad_clip_norm=config.grad_clip_norm)
        tail = ctx.run_tail(payload, optimizer, together=config.pipelined)
        loss_sum += tail.backward.loss
        token_sum += tail.backward.metrics["tokens:sum"]
        grad_norms.append(tail.optimized.metrics.get("grad_norm", 0.0))
        if plan.eval_due(step + 1):
            evals.append(evaluate(ctx, plan.eval_chunks(), step + 1))
    checkpoint = None
    if checkpoint_due(cycle, config.checkpoint_every, plan.cycles):
        checkpoint = ctx.save_checkpoint()
    return SFTCycleMetrics(
        **clock.fields(ctx),
        step_start=steps.start,
        step_end=steps.stop,
        epoch=steps.stop / plan.batches_per_epoch,
        train_loss=loss_sum / max(token_sum, 1.0),
        eval_loss=evals[-1].loss if evals else None,
        evals=evals,
        learning_rate=rate,
        grad_norm=statistics.fmean(grad_norms),
        tokens_trained=client.log.tokens("forward_backward", "trained_tokens"),
        checkpoint=checkpoint,
    )


@cycle_subflow("sft-cycle")
def sft_cycle(
    config: SFTConfig,
    cycle: int,
    start: CycleStart,
    whitney_block: str | None = None,
    run_id: str = "",
) -> SFTCycleMetrics:
    """One SFT cycle of the run `run_id` from `start`; returns its metrics, with where the
    next cycle starts."""
    plan = check_sft_config(config)  # built once per process (flows.core.loop.plans)
    ctx = CycleContext.open(config, cycle, start, whitney_block, run_id)
    return ctx.finish(run_sft_cycle(plan, ctx), {run_id: "policy"})


def summary_rows(result: SFTResult) -> list[tuple[str, str]]:
    """The SFT summary's rows: steps, eval loss first and last, then the run's whereabouts."""
    rows = [("steps", str(result.steps)), ("cycles", str(len(result.cycles)))]
    if result.eval_losses:
        rows.append((f"eval loss, step {result.eval_steps[0]}", f"{result.eval_losses[0]:.4f}"))
        rows.append((f"eval loss, step {result.eval_steps[-1]}", f"{result.eval_losses[-1]:.4f}"))
    if result.cycles:
        rows.append(("train loss, last cycle", f"{result.cycles[-1].train_loss:.4f}"))
    if result.resumed_from:
        rows.append(("resumed from", f"`{result.resumed_from}`"))
    return rows + run_rows(result)


@flow(name="sft", persist_result=False, **CLEANUP_HOOKS)
def sft_flow(config: SFTConfig, whitney_block: str | None = None) -> SFTResult:
    """Fine-tune a LoRA adapter by SFT on Whitney: check the config and data, open a labelled
    session and a run, run the cycle subflows, then save_state, export_lora, finish, close.

    Args:
        config: The SFT configuration: data, steps or epochs, learning-rate schedule.
        whitney_block: The WhitneyCredentials block of the Whitney to fine-tune on (the
            nightly deployment sets it); empty: api_url or WHITNEY_API_URL, and the key in
            WHITNEY_API_KEY.
    """
    plan = check_sft_config(config)  # fails closed before anything is allocated
    connection = resolve_connection(config.api_url, whitney_block)
    training = start_training_run(config, connection)
    first_cycle = training.start.first_cycle

    ran = run_cycles(
        sft_cycle,
        config,
        range(first_cycle, plan.cycles),
        {training.run_id: training.next_seq_id},
        whitney_block,
        lineage=training.lineage,
        run_id=training.run_id,
    )
    client = training.client(ran.seq_ids)
    final = end_training_run(
        training, client, cycle_name(plan.cycles - 1), cycles=ran.records.cycles
    )
    evals = [point for metrics in ran.records.cycles for point in metrics.evals]
    result = SFTResult(
        **dict(final),
        eval_losses=[point.loss for point in evals],
        eval_steps=[point.step for point in evals],
        steps=plan.total_steps,
        cycles=ran.records.cycles,
    )
    ran.records.add_markdown_summary(
        "SFT flow summary",
        summary_rows(result),
        "Eval loss, checkpoint and adapter of the SFT run",
        learning_curves(result.cycles),
    )
    return result
