"""The distillation flow: RL whose advantages come from the teacher. A student run learns a
frozen teacher run's distribution on its own samples, with the teacher's `logprobs` fanned out
as concurrent tasks; the cycle is the RL flow's (flows.core.loop.cycles: the same sampler calls,
the same training tail, the same loop) with the teacher's per-token reverse KL as advantages.

    distillation_flow(config)            check (fail closed); [sft_flow: train the teacher,
                                         unless an earlier attempt did: tasks.teacher]
                                         resume point, open_session (labelled), create the
                                         student run and the frozen teacher run
      [eval-start / eval]                eval loss of student and teacher (held-out split)
      cycle-{first} .. cycle-{n-1}       distill_cycle(config, cycle, start), unless the
                                         budget says stop
        student: save_weights_for_sampler `cycle-{n}` + one sample per prompt
                                         (sampler_calls: one reserved block of seq ids,
                                         submitted together)
        teacher: save_weights_for_sampler `cycle-{n}` + one logprobs per chunk of sequences
                                         (sampler_calls: one reserved block of the teacher's
                                         seq ids, run concurrently by the flow's task runner)
        advantages -kl_coef * (student_lp - teacher_lp) per completion token
        student: the RL tail (run_tail)   forward_backward (importance_sampling, rl_datums),
                                         optim_step, [save_state cycle-{n}] every
                                         checkpoint_every cycles, one call after another
      [eval-end]                         the student's eval loss after training
      save_state cycle-{last}, export_lora, finish both runs, close_session

Seq ids are allocated by the cycle before anything is submitted, so a retried cycle replays
(completed operations come back from the journal), and the chunking changes nothing but the
teacher's layout: the student's operations, and so its adapter, are the same for any chunk size,
fanned out or not, on threads or Dask (the embedded engine's logprobs of a sequence do not depend
on what else a call holds).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from prefect import flow, get_run_logger
from prefect.context import FlowRunContext

from blocks.endpoint import resolve_connection
from flows.core.config import checkpoint_due
from flows.core.evaluation.plan import completion_logprobs
from flows.core.evaluation.sampler import evaluate_after_cycle
from flows.core.loop.budget import BudgetGuard, flow_cost_model
from flows.core.loop.context import CycleContext, publish_call, sampler_calls
from flows.core.loop.cost import Usage, add_usage, format_usage, usage_of
from flows.core.loop.cycles import CycleStart, cycle_subflow, run_cycles
from flows.core.loop.off_policy_schedule import CycleSamples, Schedule, sample_ahead
from flows.core.loop.training import end_training_run, require_served, start_training_run
from flows.core.orchestration.cleanup import CLEANUP_HOOKS
from flows.core.records.run_records import run_rows, spend_rows
from flows.distill.config import LOSS_FUNCTION, DistillationConfig
from flows.distill.metrics import (
    DistillationResult,
    DistillCycleMetrics,
    EvalLosses,
    learning_curves,
)
from flows.distill.plan import (
    DistillPlan,
    check_distill_config,
    chunked,
    reverse_kl_advantages,
)
from tasks.names import cycle_name
from tasks.operations import Call, SequencedClient, WhitneyCalls
from tasks.teacher import find_trained_teacher, read_teacher_sft_journal
from whitney import wire
from whitney.datums import rl_datum
from whitney.payloads import adamw_optimizer, forward_backward_payload

ROLE_LABEL = "whitney-flows.role"
"""The run label naming the student and the teacher."""


@dataclass(frozen=True)
class Rollout:
    """One sampled completion: its prompt's tokens, its tokens and the sampler's logprobs."""

    prompt: list[int]
    tokens: list[int]
    logprobs: list[float]


def teacher_logprobs(
    ctx: CycleContext,
    config: DistillationConfig,
    teacher_run_id: str,
    rollouts: Sequence[Rollout],
) -> list[list[float]]:
    """The teacher's logprobs of each rollout's completion tokens: one `logprobs` task per
    chunk of sequences, on the teacher's sampler `cycle-{n}` of the context's cycle."""
    sequences = [{"token_ids": rollout.prompt + rollout.tokens} for rollout in rollouts]
    payloads = [{"sequences": chunk} for chunk in chunked(sequences, config.teacher_chunk_size)]
    results = sampler_calls(
        ctx.client,
        teacher_run_id,
        cycle_name(ctx.cycle),
        "logprobs",
        payloads,
        together=config.teacher_fan_out,
        publish=True,
    )
    rows = [row for result in results for row in result["logprobs"]]
    if len(rows) != len(rollouts):
        raise ValueError(f"the teacher answered {len(rows)} logprobs rows for {len(rollouts)}")
    return [
        completion_logprobs(row, len(rollout.prompt), len(rollout.tokens))
        for row, rollout in zip(rows, rollouts, strict=True)
    ]


def student_samples(plan: DistillPlan, ctx: CycleContext) -> CycleSamples:
    """The student's sampler `cycle-{n}` and the cycle's samples: one block of its requests
    on it (on-policy), or, with max_staleness, `sample_ahead` (the later cycles' requests
    beside, or this cycle's from an older sampler)."""
    config = plan.config
    name = cycle_name(ctx.cycle)
    if config.max_staleness == 0:
        requests = plan.sample_requests(ctx.cycle)
        samples = sampler_calls(
            ctx.client,
            ctx.run_id,
            name,
            "sample",
            requests,
            config.concurrent_sampling,
            publish=True,
        )
        return CycleSamples(name, samples, [])
    schedule = Schedule(
        config.max_staleness, ctx.first_cycle, config.checkpoint_every, config.cycles
    )
    return sample_ahead(ctx, name, schedule, plan.sample_requests, lead=[publish_call(name)])


def run_distill_cycle(
    plan: DistillPlan, ctx: CycleContext, teacher_run_id: str
) -> DistillCycleMetrics:
    """One distillation cycle, every call through the context's client (the cycle's ledger
    of both runs); the context's `presampled`: sample requests earlier cycles made for this
    one and later ones (max_staleness > 0)."""
    clock = ctx.clock()
    config = plan.config
    client, cycle, first_cycle = ctx.client, ctx.cycle, ctx.first_cycle
    teacher_seq_start = client.ledger.position(teacher_run_id)
    requests = plan.sample_requests(cycle)
    sampling = student_samples(plan, ctx)
    rollouts = [
        Rollout(request["prompt"]["token_ids"], sequence["tokens"], sequence["logprobs"])
        for request, sample in zip(requests, sampling.samples, strict=True)
        for sequence in sample["sequences"]
    ]
    teacher_started = time.perf_counter()
    teacher = teacher_logprobs(ctx, config, teacher_run_id, rollouts)
    teacher_seconds = time.perf_counter() - teacher_started
    data, gaps, advantages = [], [], []
    for rollout, teacher_lp in zip(rollouts, teacher, strict=True):
        per_token = reverse_kl_advantages(
            rollout.logprobs, teacher_lp, config.kl_coef, config.discount
        )
        data.append(rl_datum(rollout.prompt, rollout.tokens, rollout.logprobs, per_token))
        gaps += [
            student - taught for student, taught in zip(rollout.logprobs, teacher_lp, strict=True)
        ]
        advantages += per_token
    payload = forward_backward_payload(data, LOSS_FUNCTION)
    optimizer = adamw_optimizer(config.learning_rate, grad_clip_norm=config.grad_clip_norm)
    checkpoint = checkpoint_due(cycle, config.checkpoint_every, config.cycles)
    tail = ctx.run_tail(payload, optimizer, checkpoint=checkpoint)
    sampling.wait_ahead(client)  # the later cycles' samples ran beside this training
    schedule = Schedule(config.max_staleness, first_cycle, config.checkpoint_every, config.cycles)
    log = client.log
    metrics = DistillCycleMetrics(
        **clock.fields(ctx),
        teacher_seq_start=teacher_seq_start,
        teacher_seq_end=client.ledger.position(teacher_run_id),
        teacher_kl=statistics.fmean(gaps),
        advantage_mean=statistics.fmean(advantages),
        sampler_id=sampling.sampler_id,
        staleness=schedule.staleness_of(cycle),
        presampled=sampling.presampled_after(cycle, ctx.presampled),
        loss=tail.backward.loss,
        grad_norm=tail.optimized.metrics.get("grad_norm", 0.0),
        kl_sample_train=tail.backward.metrics.get("kl_sample_train:mean"),
        sequences=len(rollouts),
        teacher_chunks=config.teacher_chunks,
        tokens_sampled=log.tokens("sample", "sampled_tokens"),
        tokens_teacher=log.tokens("logprobs"),
        tokens_trained=log.tokens("forward_backward", "trained_tokens"),
        teacher_seconds=teacher_seconds,
        checkpoint=tail.checkpoint,
        usage=usage_of(log.operations),
        teacher_usage=usage_of(op for op in log.operations if op.run_id == teacher_run_id),
    )
    evaluation = evaluate_after_cycle(  # {} unless due; after the numbers above are taken
        ctx, config.eval_every, config.cycles, plan.evaluation
    )
    return metrics.model_copy(update=evaluation)


@cycle_subflow("distill-cycle")
def distill_cycle(
    config: DistillationConfig,
    cycle: int,
    start: CycleStart,
    whitney_block: str | None = None,
    run_id: str = "",
    teacher_run_id: str = "",
) -> DistillCycleMetrics:
    """One distillation cycle of the student `run_id` and the teacher `teacher_run_id` from
    `start`; returns its metrics, with where the next cycle starts."""
    plan = check_distill_config(config)  # built once per process (flows.core.loop.plans)
    ctx = CycleContext.open(config, cycle, start, whitney_block, run_id)
    names = {run_id: "student", teacher_run_id: "teacher"}
    return ctx.finish(run_distill_cycle(plan, ctx, teacher_run_id), names)


# --------------------------------------------------------------------------- the flow


def evaluate(
    client: SequencedClient, plan: DistillPlan, runs: dict[str, str]
) -> dict[str, tuple[float, int]]:
    """(eval loss per completion token, tokens) of each run (sampler name -> run id): a
    sampler of that name and one logprobs call on the held-out split, every run's block
    submitted together."""
    payload = plan.eval_payload()
    submitted = {
        name: client.submit(
            run_id,
            [Call("save_weights_for_sampler", {"name": name}), Call("logprobs", payload, name)],
        )
        for name, run_id in runs.items()
    }
    losses = {}
    for name, block in submitted.items():
        operations = client.collect(block)
        losses[name] = plan.eval_loss(operations[1].result_as(wire.LogprobsResult).logprobs)
    return losses


def summary_rows(result: DistillationResult) -> list[tuple[str, str]]:
    """The distillation summary's rows: teacher_kl first and last, eval losses, usage and
    cost, the budget stop, then the student run's whereabouts."""
    rows = [("cycles", str(len(result.cycles))), ("teacher", f"`{result.teacher}`")]
    if result.cycles:
        window = min(3, len(result.cycles))
        first = statistics.fmean(m.teacher_kl for m in result.cycles[:window])
        last = statistics.fmean(m.teacher_kl for m in result.cycles[-window:])
        rows.append((f"teacher_kl, first {window} cycles", f"{first:.4f}"))
        rows.append((f"teacher_kl, last {window} cycles", f"{last:.4f}"))
    if result.eval is not None:
        rows.append(("eval loss, teacher", f"{result.eval.teacher:.4f}"))
        rows.append(("eval loss, student before", f"{result.eval.student_before:.4f}"))
        rows.append(("eval loss, student after", f"{result.eval.student_after:.4f}"))
    rows += [(f"tokens, {run}", format_usage(usage)) for run, usage in result.usage.items()]
    rows += spend_rows(result)
    rows.append(("teacher run", f"`{result.teacher_run_id}`"))
    return rows + run_rows(result)


@flow(name="distillation", persist_result=False, **CLEANUP_HOOKS)
def distillation_flow(
    config: DistillationConfig, whitney_block: str | None = None
) -> DistillationResult:
    """Distill a frozen teacher into a LoRA student on Whitney: check the config, (train the
    teacher by SFT), open a labelled session with a student and a teacher run, run the cycle
    subflows within the budget, then save_state, export_lora, finish, close.

    Args:
        config: The distillation configuration: the teacher, the student, the fan-out.
        whitney_block: Name of a saved WhitneyCredentials block, for the student, the
            teacher and an SFT teacher's training alike; empty: config.api_url or
            WHITNEY_API_URL, with WHITNEY_API_KEY.
    """
    plan = check_distill_config(config)  # fails closed before anything is allocated
    connection = resolve_connection(config.api_url, whitney_block)
    require_served(config, connection)  # the student's and the teacher's, before the teacher
    whitney = WhitneyCalls(connection, config.task_retry)
    guard = BudgetGuard(config.budget, flow_cost_model(config.prices, whitney_block))
    logger = get_run_logger()
    flow_run = FlowRunContext.get().flow_run

    teacher_sft = None
    teacher_checkpoint = config.teacher_checkpoint
    sft_usage: Usage = {}
    sft_config = config.teacher_sft_config()
    if sft_config is not None:
        if flow_run.run_count > 1:
            teacher_checkpoint = whitney.run(find_trained_teacher, flow_run.id)
        if teacher_checkpoint is None:
            from flows.sft.flow import sft_flow

            logger.info("Training the teacher by SFT on %s", config.teacher_model)
            teacher_sft = sft_flow(sft_config, whitney_block)
            teacher_checkpoint = teacher_sft.checkpoint
        sft_journal = whitney.run(read_teacher_sft_journal, teacher_checkpoint)
        sft_usage = usage_of(sft_journal)
        guard.add(sft_usage)  # the budget counts the teacher's training
    teacher_label = teacher_checkpoint or f"base:{config.teacher_model}"

    training = start_training_run(config, connection, "student", {ROLE_LABEL: "student"})
    start, student = training.start, training.run_id
    teacher = training.add_run(
        "teacher",
        base_model=config.teacher_model,
        lora_rank=config.teacher_rank,
        trainable=False,
        from_checkpoint=teacher_checkpoint,
        labels={ROLE_LABEL: "teacher"},
    )
    logger.info(
        "Student run %s, teacher run %s (%s): cycles %d..%d, %d teacher logprobs tasks a cycle",
        student,
        teacher.run_id,
        teacher_label,
        start.first_cycle,
        config.cycles - 1,
        config.teacher_chunks,
    )
    client = training.client({student: training.next_seq_id, teacher.run_id: teacher.next_seq_id})
    before = {}
    if plan.eval_set:
        before = evaluate(client, plan, {"eval-start": student, "eval": teacher.run_id})
    guard.add(usage_of(client.log.operations))
    counted = len(client.log.operations)
    ran = run_cycles(
        distill_cycle,
        config,
        range(start.first_cycle, config.cycles),
        {run_id: client.ledger.position(run_id) for run_id in (student, teacher.run_id)},
        whitney_block,
        guard=guard,
        estimate=plan.cycle_usage_bound,
        lineage=training.lineage,
        run_id=student,
        teacher_run_id=teacher.run_id,
    )
    for run_id, position in ran.seq_ids.items():  # the flow's own calls go on from there
        client.ledger.move_to(run_id, position)
    last_cycle = ran.last.cycle if ran.last is not None else start.first_cycle - 1
    eval_losses = None
    if plan.eval_set:
        after = evaluate(client, plan, {"eval-end": student})
        eval_losses = EvalLosses(
            student_before=before["eval-start"][0],
            student_after=after["eval-end"][0],
            teacher=before["eval"][0],
            tokens=before["eval"][1],
        )
    final_name = cycle_name(last_cycle) if last_cycle >= 0 else None
    final = end_training_run(training, client, final_name, [teacher.run_id], ran.records.cycles)

    guard.add(usage_of(client.log.operations[counted:]))  # eval and the end, after the cycles
    by_run_usage = run_usage(client.log.operations, ran.records.cycles, teacher.run_id)
    if sft_usage:
        by_run_usage["teacher_sft"] = sft_usage
    result = DistillationResult(
        **dict(final),
        teacher_run_id=teacher.run_id,
        teacher=teacher_label,
        cycles=ran.records.cycles,
        eval=eval_losses,
        usage=by_run_usage,
        total_tokens=guard.tokens,
        cost=guard.cost,
        budget_stop=guard.stopped,
        teacher_sft=teacher_sft,
    )
    ran.records.add_markdown_summary(
        "Distillation flow summary",
        summary_rows(result),
        "teacher_kl, eval losses, usage and cost, checkpoint and adapter of the distillation",
        learning_curves(result.cycles),
    )
    if guard.stopped:
        logger.warning("Stopped early by the budget: %s", guard.stopped)
    return result


def run_usage(
    operations: Sequence[wire.Operation],
    cycles: Sequence[DistillCycleMetrics],
    teacher_run_id: str,
) -> dict[str, Usage]:
    """Billed usage per run: the flow's own operations (eval, the end) plus the cycles'."""
    student = usage_of(op for op in operations if op.run_id != teacher_run_id)
    teacher = usage_of(op for op in operations if op.run_id == teacher_run_id)
    for metrics in cycles:
        add_usage(teacher, metrics.teacher_usage)
        student_part = {
            kind: {
                name: value - metrics.teacher_usage.get(kind, {}).get(name, 0)
                for name, value in counters.items()
            }
            for kind, counters in metrics.usage.items()
        }
        add_usage(student, student_part)
    return {"student": student, "teacher": teacher}
