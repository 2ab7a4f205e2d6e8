"""The RL flow: the ordered loop skeleton of Whitney's Loop building blocks, one subflow run
per cycle (the outer loop: flows.core.loop.cycles).

    rl_flow(config)                       resume point (tasks.resume), open_session
                                          (labelled), create_run (from_checkpoint if resuming),
                                          the recipe's auxiliary runs (flows.rl.auxiliary)
      cycle-{first} .. cycle-{n-1}        rl_cycle (flows.rl.cycle), on its cycle context
                                          from the seq ids the loop carries
        save_weights_for_sampler[seq=k]   -> sampler_id (the first cycle, or unpipelined only)
        sample[seq=k+1 .. k+P]            one request per prompt, a reserved block of ids
        rewards, advantages, build_loss   (recipe calls through ctx take the next ids)
        [resampling, finish_cycle]        flows.rl.batch: uniform groups resampled or dropped;
                                          the recipe's cycle end (a critic's update)
        forward_backward, optim_step      the tail (CycleContext.run_tail): pipelined,
        [save_state cycle-{n}]            submitted together with the checkpoint when one is
        [save_weights_for_sampler]        due and the next cycle's sampler, named cycle-{n+1}
      save_state cycle-{n-1}, export_lora, finish_run, close_session

Every operation is a task with an explicit seq id. A cycle starts at the id where the previous
one ended and allocates deterministically, so a retried cycle replays: completed operations
come back from the server's journal, the rest run once. A retried flow run, or one given
`resume_from`, continues on a new run from a `cycle-{n}` checkpoint (tasks.resume).

Pipelining: a cycle waits only where it needs a result.

The Loop building blocks' loop waits for every answer in turn. A cycle needs only two of them:
the samples (build_loss reads them) and, at its end, the training results (its record). So a
pipelined cycle submits its tail (forward_backward, optim_step, the `save_state` checkpoint
when one is due, and the `save_weights_for_sampler` that publishes the next cycle's sampler)
back to back as task futures with consecutive seq ids, and waits for them together: one round
trip instead of three or four. The sampler is named `cycle-{n+1}`; with a name, the sampler
id is known before the answer (docs/api.md), so the next cycle samples from it with no
save_weights_for_sampler call of its own. The first cycle a flow runs publishes its own.

The server executes a run's operations strictly in seq order, so the weights each sampler
snapshots, and therefore the samples and the adapter, are those of one call after another; only
the seq-id layout differs (a cycle's ids no longer start with its save_weights_for_sampler). A
retried cycle resubmits the same ids and replays.

Off-policy (`max_staleness` > 0, flows.core.loop.off_policy_schedule): a cycle also requests the
samples
of the later cycles its sampler serves, which the server samples while this cycle trains, and reads
its own back from the journal when an earlier cycle requested them (`sample_cycle`); clipped losses
then clip around the current weights (flows.rl.off_policy).

One thing pipelining changes: operations are on the server before the one ahead of them has
answered. If that one is refused before it is journaled (a 4xx), its seq id stays a gap and
those behind it would wait out the server's gap timeout; if it fails in execution, they run
anyway. Neither can be repaired by a replay (the same request gets the same answer), so on a
non-retryable failure in the tail the cycle cancels the run (the operations waiting behind the
failure end at once: `SequencedClient.collect`) and fails; a retried flow run resumes from a
checkpoint that precedes the failure (`tasks.resume`).
"""

from __future__ import annotations

from uuid import UUID

from prefect import flow

from blocks.endpoint import resolve_connection
from flows.core.loop.budget import BudgetGuard, flow_cost_model
from flows.core.loop.cost import format_cost, format_usage
from flows.core.loop.cycles import run_cycles
from flows.core.loop.training import end_training_run, start_training_run
from flows.core.orchestration.cleanup import CLEANUP_HOOKS
from flows.core.records.run_records import RunRecords, run_rows
from flows.core.records.summary_parts import first_and_last
from flows.rl.auxiliary import (
    ledger_starts,
    open_auxiliary_runs,
    save_auxiliary_checkpoints,
)
from flows.rl.config import RLConfig
from flows.rl.cycle import rl_cycle
from flows.rl.judge import open_judge_run
from flows.rl.metrics import RLResult, learning_curves
from flows.rl.plan import check_rl_config
from tasks.names import cycle_name


def add_summary(records: RunRecords, result: RLResult) -> UUID:
    """The RL flow run's final markdown summary: the checkpoint, the exported adapter, the
    reward over the first and last cycles."""
    rewards = first_and_last("reward", result.cycles, lambda cycle: cycle.reward_mean, 5)
    rows = [
        ("cycles", str(len(result.cycles))),
        *((label, f"{reward:.3f}") for label, reward in rewards),
        ("tokens", format_usage(result.usage)),
        ("estimated cost", format_cost(result.cost)),
    ]
    if result.budget_stop:
        rows.append(("stopped early", result.budget_stop))
    return records.add_markdown_summary(
        "RL flow summary",
        rows + run_rows(result),
        "Checkpoint and exported adapter of the RL flow run",
        learning_curves(result.cycles),
    )


@flow(name="rl", persist_result=False, **CLEANUP_HOOKS)
def rl_flow(config: RLConfig, whitney_block: str | None = None) -> RLResult:
    """Train a LoRA adapter by RL on Whitney: validate, open a labelled session and a run,
    run `config.cycles` cycle subflows, then save_state, export_lora, finish, close.

    Args:
        config: The RL configuration: environment, loss and its recipe, sampling, cycles.
        whitney_block: A saved WhitneyCredentials block to train on; empty: `api_url`
            (else WHITNEY_API_URL) with WHITNEY_API_KEY.
    """
    plan = check_rl_config(config)  # fails closed before anything is allocated
    connection = resolve_connection(config.api_url, whitney_block)
    guard = BudgetGuard(config.budget, flow_cost_model(config.prices, whitney_block))
    training = start_training_run(config, connection)
    start, run_id = training.start, training.run_id
    opened = open_auxiliary_runs(training, plan.recipe, start.checkpoints)
    judge, judge_starts = None, {}
    if plan.rubric is not None:
        judge, judge_seq = open_judge_run(training, plan.rubric.model, config.judge.cache_dir)
        judge_starts = {judge.run_id: judge_seq}
    ran = run_cycles(
        rl_cycle,
        config,
        range(start.first_cycle, config.cycles),
        {run_id: training.next_seq_id, **ledger_starts(opened), **judge_starts},
        whitney_block,
        guard=guard,
        lineage=training.lineage,
        run_id=run_id,
        auxiliary=opened,
        judge=judge,
    )
    last_cycle = ran.last.cycle if ran.last is not None else start.first_cycle - 1
    client = training.client(ran.seq_ids)
    save_auxiliary_checkpoints(client, opened, last_cycle)  # a critic's, beside the policy's
    others = [handle.run_id for handle in opened] + list(judge_starts)
    final = end_training_run(  # its save_state is a resume point
        training, client, cycle_name(last_cycle), others, ran.records.cycles
    )
    result = RLResult(
        **dict(final),
        cycles=ran.records.cycles,
        usage=guard.used,
        cost=guard.cost,
        budget_stop=guard.stopped,
    )
    add_summary(ran.records, result)
    return result
