"""The sweep flow: a grid or random search over a training flow's config by successive
halving, every trial a flow run of that flow's deployment.

    sweep_flow(config)                 check every trial's config (fail closed), set the
                                       global concurrency limit to max_concurrent
      rung 0: trial-i-rung-0 x n       run_trial tasks: each a flow run of the deployment
                                       (run_deployment, a subflow of the sweep) holding a
                                       slot of the limit, cycles 0..rungs[0]-1
      keep the best `keep` share       by the metric's last value (flows.sweep.plan)
      rung 1: trial-i-rung-1 x kept    each resumed from its rung-0 final checkpoint
      ...
      the comparison artifact, whitney.sweep.best, [promote-checkpoint]

A trial's rung ends like any training flow run: save_state, export, finish, close, so a
stopped trial holds nothing on Whitney; the sweep releases anything its flow run left open
(a failure) as soon as it ends. Cancelling the sweep cancels its running trials.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from prefect import Flow, flow, get_client, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterTags
from prefect.client.schemas.objects import FlowRun
from prefect.client.schemas.sorting import FlowRunSort
from prefect.context import FlowRunContext
from prefect.deployments import run_deployment
from prefect.states import Cancelling, State
from prefect.task_runners import ThreadPoolTaskRunner

from blocks.endpoint import resolve_connection
from flows.core.loop.budget import check_budget, flow_cost_model
from flows.core.loop.cost import Budget
from flows.core.orchestration.paging import every_page
from flows.core.records.events import sweep_best
from flows.core.records.run_records import artifact_key
from flows.sweep.comparison import comparison_markdown, summaries
from flows.sweep.config import SweepConfig
from flows.sweep.kinds import trial_kind
from flows.sweep.ledger import CostLedger
from flows.sweep.plan import Trial, best_trial, check_sweep_config, survivors, trial_settings
from flows.sweep.results import SweepResult, TrialRung
from flows.sweep.trials import SWEEP_TAG, TrialRequest, run_trial

PROMOTE_DEPLOYMENT = "promote-checkpoint/promote-checkpoint"
WAITING_TRIALS = 256
"""Threads of the sweep's task runner: trials waiting for a slot wait in one each."""


def comparison_key(sweep_id: UUID) -> str:
    """The key of the sweep's comparison artifact: its flow run's id, not its name (names
    repeat)."""
    return artifact_key("sweep", str(sweep_id))


def cancel_trials(flow: Flow[..., Any], flow_run: FlowRun, state: State) -> None:
    """The sweep's hook on failure, crash and cancellation: cancel its trials still running
    (their own hooks then release their Whitney runs)."""
    with get_client(sync_client=True) as prefect:
        runs = every_page(
            lambda offset: prefect.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    tags=FlowRunFilterTags(all_=[f"{SWEEP_TAG}:{flow_run.id}"])
                ),
                sort=FlowRunSort.ID_DESC,
                offset=offset,
            )
        )
        for run in runs:
            if run.state is not None and not run.state.is_final():
                prefect.set_flow_run_state(run.id, Cancelling(), force=True)


def promote(config: SweepConfig, params: dict[str, Any], checkpoint: str) -> None:
    """Start promote-checkpoint for the best trial's checkpoint with its flow's eval settings
    (not waited for: it pauses for a person)."""
    kind = trial_kind(config.kind)
    settings = kind.config.model_validate(trial_settings(config, Trial(-1, params), 1, None))
    evaluation = settings.eval_settings()
    if evaluation is None:
        get_run_logger().warning("promote: the trials' config evaluates nothing; not promoted")
        return
    promotion = run_deployment(
        PROMOTE_DEPLOYMENT,
        parameters={
            "config": {
                "checkpoint": checkpoint,
                "evaluation": evaluation.model_dump(mode="json"),
                "target_dir": config.promote_target_dir,
                "api_url": settings.api_url,
            }
        },
        timeout=0,
        as_subflow=False,
    )
    get_run_logger().info("promote-checkpoint started: flow run %s", promotion.name)


@flow(
    name="sweep",
    persist_result=False,
    task_runner=ThreadPoolTaskRunner(max_workers=WAITING_TRIALS),
    on_failure=[cancel_trials],
    on_crashed=[cancel_trials],
    on_cancellation=[cancel_trials],
)
def sweep_flow(config: SweepConfig, whitney_block: str | None = None) -> SweepResult:
    """Search a training flow's config by successive halving: every trial a flow run of its
    deployment, at most max_concurrent at once; then compare them and name the best.

    Args:
        config: The sweep: the flow kind, the shared settings, the searched fields, the
            rungs, the metric, the concurrency and the budget.
        whitney_block: The WhitneyCredentials block the trials and the sweep talk to Whitney
            through; empty: the deployment's default for the trials, and api_url or
            WHITNEY_API_URL for the sweep.
    """
    logger = get_run_logger()
    trials = check_sweep_config(config)  # fails closed before any trial starts
    kind = trial_kind(config.kind)
    prices = flow_cost_model(config.prices, whitney_block)
    check_budget(Budget(max_cost=config.max_cost), prices)
    connection = resolve_connection(config.base.get("api_url"), whitney_block)
    sweep_run = FlowRunContext.get().flow_run
    with get_client(sync_client=True) as prefect:
        prefect.upsert_global_concurrency_limit_by_name(
            config.concurrency_limit, config.max_concurrent
        )
    ledger = CostLedger(config.max_cost)
    rungs: dict[int, list[TrialRung]] = {trial.index: [] for trial in trials}
    alive = [trial.index for trial in trials]
    for rung, cycles in enumerate(config.rungs):
        logger.info("rung %d: %d trials to %d cycles", rung, len(alive), cycles)
        futures = []
        for index in alive:
            previous = rungs[index][-1] if rungs[index] else None
            settings = trial_settings(
                config, trials[index], cycles, previous.checkpoint if previous else None
            )
            parameters: dict[str, Any] = {"config": settings}
            if whitney_block:
                parameters["whitney_block"] = whitney_block
            request = TrialRequest(
                trial=index,
                rung=rung,
                cycles=cycles,
                first_cycle=previous.cycles if previous else 0,
                deployment=config.deployment or kind.deployment,
                parameters=parameters,
                flow_run_name=f"{sweep_run.name}-trial-{index}-rung-{rung}",
                sweep_flow_run_id=str(sweep_run.id),
                concurrency_limit=config.concurrency_limit,
                metric=config.metric,
                timeout_s=config.trial_timeout_s,
            )
            futures.append(run_trial.submit(request, connection, prices, ledger))
        ended = [future.result() for future in futures]
        for trial_rung in ended:
            rungs[trial_rung.trial].append(trial_rung)
        scores = {trial_rung.trial: trial_rung.score for trial_rung in ended}
        if rung < len(config.rungs) - 1:
            alive = survivors(scores, config.mode, config.keep)
            logger.info("rung %d keeps trials %s of %s", rung, alive, sorted(scores))
    best = best_trial(scores, config.mode)
    best_rung = rungs[best][-1] if best is not None else None
    costs = [rung.cost for runs in rungs.values() for rung in runs if rung.cost is not None]
    result = SweepResult(
        metric=config.metric,
        mode=config.mode,
        trials=summaries([trial.params for trial in trials], rungs, len(config.rungs), best),
        best=best,
        best_checkpoint=best_rung.checkpoint if best_rung else None,
        cost=sum(costs) if costs else None,
    )
    create_markdown_artifact(
        markdown=comparison_markdown(result, config.rungs),
        key=comparison_key(sweep_run.id),
        description=f"Every trial of the sweep, by {config.metric}",
    )
    if best is None or best_rung is None:
        logger.warning("no trial finished the last rung: no best trial")
        return result
    params = trials[best].params
    sweep_best(
        best, params, config.metric, best_rung.score, best_rung.checkpoint, best_rung.flow_run_id
    )
    logger.info("best: trial %d %s, %s = %s", best, params, config.metric, best_rung.score)
    if config.promote and best_rung.checkpoint:
        promote(config, params, best_rung.checkpoint)
    return result
