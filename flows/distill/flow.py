"""The distillation flow: a student run learns a frozen teacher run's distribution on its own
samples, with the teacher's `logprobs` fanned out as concurrent tasks.

    distillation_flow(config)            check (fail closed); [sft_flow: train the teacher,
                                         unless an earlier attempt did: flows.distill.teacher]
                                         resume point, open_session (labelled), create the
                                         student run and the frozen teacher run
      [eval-start / eval]                eval loss of student and teacher (held-out split)
      cycle-{first} .. cycle-{n-1}       distill_cycle(...), unless the budget says stop
        student: save_weights_for_sampler `cycle-{n}` + one sample per prompt
                                         (one reserved block of seq ids, submitted together)
        teacher: save_weights_for_sampler `cycle-{n}` + one logprobs per chunk of sequences
                                         (one reserved block of the teacher's seq ids, run
                                         concurrently by the flow's task runner)
        advantages -kl_coef * (student_lp - teacher_lp) per completion token
        student: forward_backward (importance_sampling, rl_datums), optim_step
                 [save_state cycle-{n}]  every checkpoint_every cycles
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
from datetime import UTC, datetime
from typing import Any

from prefect import flow, get_run_logger
from prefect.context import FlowRunContext
from prefect.futures import PrefectFuture
from prefect.task_runners import ThreadPoolTaskRunner
from prefect.utilities.annotations import quote

from flows.core.budget import BudgetGuard, flow_cost_model
from flows.core.cancellation import CancellationWatch
from flows.core.checkpoints import check_resume_from, checkpoint_due, checkpoint_name
from flows.core.cleanup import CLEANUP_HOOKS
from flows.core.connection import resolve_connection
from flows.core.cost import Usage, add_usage, format_cost, format_usage, usage_of
from flows.core.cycle_operations import RecordingLog, record_cycle_operations
from flows.core.heartbeat import subflows_without_heartbeat
from flows.core.records import RunRecords, record_cycle_table, run_rows
from flows.core.sequenced_client import SequencedClient
from flows.core.sequencing import SeqLedger
from flows.core.task_runners import cycle_task_runners
from flows.core.training import (
    export_adapter,
    release_training_run,
    save_final_state,
    start_training_run,
)
from flows.distill.config import LOSS_FUNCTION, DistillationConfig
from flows.distill.metrics import DistillationResult, DistillCycleMetrics, EvalLosses
from flows.distill.plan import (
    DistillPlan,
    check_distill_config,
    chunked,
    completion_logprobs,
    load_distill_plan,
    reverse_kl_advantages,
)
from flows.distill.teacher import find_trained_teacher, read_teacher_sft_usage
from tasks.lifecycle import cancel_run, create_run
from tasks.operations import RUN_OPERATION_TASKS, SAMPLER_OPERATION_TASKS
from tasks.retry import with_retry
from whitney import wire
from whitney.datums import rl_datum
from whitney.errors import WhitneyError
from whitney.payloads import adamw_optimizer, forward_backward_payload, result_sampler_id

Call = tuple[str, dict[str, Any], str | None]
"""(kind, payload, sampler_id or None for a run operation)."""
ROLE_LABEL = "whitney-flows.role"
"""The run label naming the student and the teacher."""


def submit_calls(
    client: SequencedClient, run_id: str, calls: Sequence[Call]
) -> list[PrefectFuture[wire.Operation]]:
    """Reserve a block of the run's seq ids for `calls` and submit them all as tasks: the
    flow's task runner runs them concurrently; the server executes them in seq order."""
    seq_ids = client.ledger.reserve(run_id, len(calls))
    futures = []
    for seq, (kind, payload, sampler_id) in zip(seq_ids, calls, strict=True):
        tasks = RUN_OPERATION_TASKS if sampler_id is None else SAMPLER_OPERATION_TASKS
        task = with_retry(tasks[kind], client.retry)
        route = () if sampler_id is None else (sampler_id,)
        futures.append(task.submit(client.connection, run_id, *route, seq, task_payload(payload)))
    return futures


def task_payload(payload: dict[str, Any]) -> Any:
    """The payload as a task argument: `quote`d on the thread pool, so Prefect does not walk
    it looking for futures (see flows.core.sequenced_client); as is on Dask, whose
    serialisation of task arguments turns the `quote` wrapper into a plain tuple."""
    context = FlowRunContext.get()
    if isinstance(getattr(context, "task_runner", None), ThreadPoolTaskRunner):
        return quote(payload)
    return payload


def collect(
    client: SequencedClient, run_id: str, futures: Sequence[PrefectFuture[wire.Operation]]
) -> list[wire.Operation]:
    """The operations of submitted calls, waited for in seq order, recorded in the log.

    On a non-retryable failure the run is cancelled before the error propagates: the calls
    behind a refused one would otherwise wait out the server's gap timeout.
    """
    operations: list[wire.Operation] = []
    for future in futures:
        try:
            operations.append(future.result())
        except WhitneyError as error:
            if not error.retryable:
                cancel_behind_failure(client, run_id)
            raise
    for operation in operations:
        client.log.record(operation)
    return operations


def submit_block(
    client: SequencedClient, run_id: str, calls: Sequence[Call], timing: str
) -> list[wire.Operation]:
    """`calls` submitted together on a reserved block of seq ids; their operations, in order
    (the results of one call after another: the server executes in seq order)."""
    with client.log.timing(timing):
        return collect(client, run_id, submit_calls(client, run_id, calls))


def cancel_behind_failure(client: SequencedClient, run_id: str) -> None:
    try:
        with_retry(cancel_run, client.retry)(client.connection, run_id)
    except Exception as error:  # the cleanup hook cancels it too
        get_run_logger().warning("Could not cancel Whitney run %s: %r", run_id, error)


def sampler_block(
    client: SequencedClient,
    run_id: str,
    name: str,
    kind: str,
    payloads: Sequence[dict[str, Any]],
    together: bool,
) -> list[dict[str, Any]]:
    """save_weights_for_sampler named `name`, then one `kind` call per payload on it: one
    submitted block (`together`; the sampler is named, so its calls queue before it answers)
    or one call after another, with the same seq ids either way. The calls' results."""
    if together:
        calls: list[Call] = [("save_weights_for_sampler", {"name": name}, None)]
        calls += [(kind, payload, name) for payload in payloads]
        operations = submit_block(client, run_id, calls, timing=kind)
        result_sampler_id(operations[0])
        return [operation.result or {} for operation in operations[1:]]
    sampler = client.run_operation(run_id, "save_weights_for_sampler", {"name": name})
    sampler_id = result_sampler_id(sampler)
    return [client.sampler_operation(run_id, sampler_id, kind, payload) for payload in payloads]


@dataclass(frozen=True)
class Rollout:
    """One sampled completion: its prompt's tokens, its tokens and the sampler's logprobs."""

    prompt: list[int]
    tokens: list[int]
    logprobs: list[float]


def teacher_logprobs(
    client: SequencedClient,
    config: DistillationConfig,
    teacher_run_id: str,
    cycle: int,
    rollouts: Sequence[Rollout],
) -> list[list[float]]:
    """The teacher's logprobs of each rollout's completion tokens: one `logprobs` task per
    chunk of sequences, on the teacher's sampler `cycle-{n}`."""
    sequences = [{"token_ids": rollout.prompt + rollout.tokens} for rollout in rollouts]
    payloads = [{"sequences": chunk} for chunk in chunked(sequences, config.teacher_chunk_size)]
    results = sampler_block(
        client,
        teacher_run_id,
        checkpoint_name(cycle),
        "logprobs",
        payloads,
        together=config.teacher_fan_out,
    )
    rows = [row for result in results for row in result["logprobs"]]
    if len(rows) != len(rollouts):
        raise ValueError(f"the teacher answered {len(rows)} logprobs rows for {len(rollouts)}")
    return [
        completion_logprobs(row, len(rollout.prompt), len(rollout.tokens))
        for row, rollout in zip(rows, rollouts, strict=True)
    ]


def run_distill_cycle(
    plan: DistillPlan, client: SequencedClient, cycle: int, run_id: str, teacher_run_id: str
) -> DistillCycleMetrics:
    """One distillation cycle, every call through `client` (the cycle's ledger of both runs;
    its log must be a RecordingLog)."""
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    config = plan.config
    seq_start = client.ledger.position(run_id)
    teacher_seq_start = client.ledger.position(teacher_run_id)
    requests = plan.sample_requests(cycle)
    samples = sampler_block(
        client, run_id, checkpoint_name(cycle), "sample", requests, config.concurrent_sampling
    )
    rollouts = [
        Rollout(request["prompt"]["token_ids"], sequence["tokens"], sequence["logprobs"])
        for request, sample in zip(requests, samples, strict=True)
        for sequence in sample["sequences"]
    ]
    teacher_started = time.perf_counter()
    teacher = teacher_logprobs(client, config, teacher_run_id, cycle, rollouts)
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
    backward = client.run_operation(
        run_id, "forward_backward", forward_backward_payload(data, LOSS_FUNCTION)
    )
    optimizer = adamw_optimizer(config.learning_rate, grad_clip_norm=config.grad_clip_norm)
    optimized = client.run_operation(run_id, "optim_step", {"optimizer": optimizer})
    checkpoint = None
    if checkpoint_due(cycle, config.checkpoint_every, config.cycles):
        state = {"name": checkpoint_name(cycle)}
        checkpoint = client.run_operation(run_id, "save_state", state)["checkpoint"]
    log: RecordingLog = client.log  # type: ignore[assignment]
    return DistillCycleMetrics(
        cycle=cycle,
        started_at=started_at,
        seq_start=seq_start,
        seq_end=client.ledger.position(run_id),
        teacher_seq_start=teacher_seq_start,
        teacher_seq_end=client.ledger.position(teacher_run_id),
        teacher_kl=statistics.fmean(gaps),
        advantage_mean=statistics.fmean(advantages),
        loss=float(backward["loss"]),
        grad_norm=float(optimized.get("metrics", {}).get("grad_norm", 0.0)),
        kl_sample_train=backward.get("metrics", {}).get("kl_sample_train:mean"),
        sequences=len(rollouts),
        teacher_chunks=config.teacher_chunks,
        tokens_sampled=log.tokens("sample", "sampled_tokens"),
        tokens_teacher=log.tokens("logprobs"),
        tokens_trained=log.tokens("forward_backward", "trained_tokens"),
        teacher_seconds=teacher_seconds,
        checkpoint=checkpoint,
        usage=usage_of(log.operations),
        teacher_usage=usage_of(op for op in log.operations if op.run_id == teacher_run_id),
        op_seconds=dict(log.seconds),
        wall_seconds=time.perf_counter() - started,
    )


@flow(name="distill-cycle", flow_run_name="cycle-{cycle}", persist_result=False, **CLEANUP_HOOKS)
def distill_cycle(
    config: DistillationConfig,
    cycle: int,
    run_id: str,
    seq_start: int,
    teacher_run_id: str,
    teacher_seq_start: int,
    whitney_block: str | None = None,
) -> DistillCycleMetrics:
    """One distillation cycle from `seq_start` on the student and `teacher_seq_start` on the
    teacher; returns its metrics, with the seq ids the next cycle starts at.

    Retried by replaying: the same calls with the same seq ids, answered from the journal.
    """
    log = RecordingLog()
    client = SequencedClient(
        resolve_connection(config.api_url, whitney_block),
        SeqLedger({run_id: seq_start, teacher_run_id: teacher_seq_start}),
        config.task_retry,
        log,
    )
    metrics = run_distill_cycle(load_distill_plan(config), client, cycle, run_id, teacher_run_id)
    record_cycle_table(metrics)
    record_cycle_operations(
        cycle,
        {
            "student": [op for op in log.operations if op.run_id == run_id],
            "teacher": [op for op in log.operations if op.run_id == teacher_run_id],
        },
    )
    return metrics


# --------------------------------------------------------------------------- the flow


def evaluate(
    client: SequencedClient, plan: DistillPlan, runs: dict[str, str]
) -> dict[str, tuple[float, int]]:
    """(eval loss per completion token, tokens) of each run (sampler name -> run id): a
    sampler of that name and one logprobs call on the held-out split, every run's block
    submitted together."""
    payload = plan.eval_payload()
    with client.log.timing("eval"):
        submitted = {
            name: submit_calls(
                client,
                run_id,
                [("save_weights_for_sampler", {"name": name}, None), ("logprobs", payload, name)],
            )
            for name, run_id in runs.items()
        }
        losses = {}
        for name, futures in submitted.items():
            operations = collect(client, runs[name], futures)
            losses[name] = plan.eval_loss((operations[1].result or {})["logprobs"])
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
    rows.append(("tokens, total", f"{result.total_tokens:,}"))
    rows.append(("estimated cost", format_cost(result.cost)))
    if result.budget_stop:
        rows.append(("stopped early", result.budget_stop))
    if result.resumed_from:
        rows.append(("resumed from", f"`{result.resumed_from}`"))
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
        config: The distillation configuration.
        whitney_block: Name of a saved WhitneyCredentials block; empty: config.api_url or
            WHITNEY_API_URL, with WHITNEY_API_KEY.
    """
    plan = check_distill_config(config)  # fails closed before anything is allocated
    check_resume_from(config.resume_from, config.cycles)
    connection = resolve_connection(config.api_url, whitney_block)
    guard = BudgetGuard(config.budget, flow_cost_model(config.prices, whitney_block))
    logger = get_run_logger()
    flow_run = FlowRunContext.get().flow_run

    teacher_sft = None
    teacher_checkpoint = config.teacher_checkpoint
    sft_usage: Usage = {}
    sft_config = config.teacher_sft_config()
    if sft_config is not None:
        if flow_run.run_count > 1:
            teacher_checkpoint = with_retry(find_trained_teacher, config.task_retry)(
                connection, flow_run.id
            )
        if teacher_checkpoint is None:
            from flows.sft.flow import sft_flow

            logger.info("Training the teacher by SFT on %s", config.teacher_model)
            teacher_sft = sft_flow(sft_config, whitney_block)
            teacher_checkpoint = teacher_sft.checkpoint
        sft_usage = with_retry(read_teacher_sft_usage, config.task_retry)(
            connection, teacher_checkpoint
        )
        guard.add(sft_usage)  # the budget counts the teacher's training
    teacher_label = teacher_checkpoint or f"base:{config.teacher_model}"

    training = start_training_run(config, connection, "student", {ROLE_LABEL: "student"})
    start, student = training.start, training.run_id
    teacher = with_retry(create_run, config.task_retry)(
        connection,
        training.session_id,
        config.provider,
        config.teacher_model,
        lora_rank=config.teacher_rank,
        seed=config.seed,
        trainable=False,
        from_checkpoint=teacher_checkpoint,
        idempotency_key=f"{training.attempt}-teacher",
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
    log = RecordingLog()
    client = SequencedClient(
        connection,
        SeqLedger({student: training.next_seq_id, teacher.run_id: teacher.next_seq_id}),
        config.task_retry,
        log,
    )
    before = {}
    if plan.eval_set:
        before = evaluate(client, plan, {"eval-start": student, "eval": teacher.run_id})
    guard.add(usage_of(log.operations))
    counted = len(log.operations)

    records = RunRecords(
        f"distill-{flow_run.name}", config.cycles - start.first_cycle, config.metrics_path
    )
    seq = client.ledger.position(student)
    teacher_seq = client.ledger.position(teacher.run_id)
    last_cycle = start.first_cycle - 1
    with (
        cycle_task_runners(config) as runner_for_cycle,
        CancellationWatch(flow_run.id) as cancellation,
        subflows_without_heartbeat(),
    ):
        cycle_flow = distill_cycle.with_options(
            retries=config.cycle_retries,
            retry_delay_seconds=config.cycle_retry_delay_s,
            task_runner=runner_for_cycle(),
        )
        for cycle in range(start.first_cycle, config.cycles):
            cancellation.raise_if_requested()
            reason = guard.stop_reason(cycle, estimate=plan.cycle_usage_bound(cycle))
            if reason is not None:
                logger.warning("%s: saving, exporting and closing now", reason)
                break
            metrics = cycle_flow(
                config, cycle, student, seq, teacher.run_id, teacher_seq, whitney_block
            )
            metrics = metrics.model_copy(update={"cost": guard.add_cycle(metrics.usage)})
            seq, teacher_seq = metrics.seq_end, metrics.teacher_seq_end
            last_cycle = cycle
            records.add_cycle(metrics)

    client.ledger = SeqLedger({student: seq, teacher.run_id: teacher_seq})
    eval_losses = None
    if plan.eval_set:
        after = evaluate(client, plan, {"eval-end": student})
        eval_losses = EvalLosses(
            student_before=before["eval-start"][0],
            student_after=after["eval-end"][0],
            teacher=before["eval"][0],
            tokens=before["eval"][1],
        )
    final_name = checkpoint_name(last_cycle) if last_cycle >= 0 else None
    checkpoint = save_final_state(client, student, final_name)
    adapter = export_adapter(client, student)
    release_training_run(training, config, [teacher.run_id])

    guard.add(usage_of(log.operations[counted:]))  # eval and the end, after the cycles
    by_run = run_usage(log.operations, records.cycles, teacher.run_id)
    if sft_usage:
        by_run["teacher_sft"] = sft_usage
    result = DistillationResult(
        session_id=training.session_id,
        run_id=student,
        teacher_run_id=teacher.run_id,
        teacher=teacher_label,
        checkpoint=checkpoint,
        adapter=adapter,
        cycles=records.cycles,
        eval=eval_losses,
        usage=by_run,
        total_tokens=guard.tokens,
        cost=guard.cost,
        budget_stop=guard.stopped,
        resumed_from=start.checkpoint,
        teacher_sft=teacher_sft,
    )
    records.add_markdown_summary(
        "Distillation flow summary",
        summary_rows(result),
        "teacher_kl, eval losses, usage and cost, checkpoint and adapter of the distillation",
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
