"""The sweep's comparison: a markdown table of every trial (its values, its metric at each
rung, how it ended, its cost) and one picture of every trial's curve. No Prefect."""

from __future__ import annotations

import base64
from collections.abc import Sequence

from flows.core.loop.cost import format_cost
from flows.core.records.plots import Line, Panel, render_png
from flows.sweep.results import SKIPPED, SweepResult, TrialRung, TrialSummary


def trial_status(rungs: Sequence[TrialRung], rung_count: int, best: bool) -> str:
    """How a trial ended: best, finished, stopped at rung r (halving), failed or skipped."""
    last = rungs[-1]
    if last.state == SKIPPED:
        return f"skipped at rung {last.rung} (max_cost)"
    if last.state != "COMPLETED":
        return f"{last.state.lower()} at rung {last.rung}"
    if best:
        return "best"
    if last.rung < rung_count - 1:
        return f"stopped at rung {last.rung}"
    return "finished"


def score_text(rung: TrialRung | None) -> str:
    return "" if rung is None or rung.score is None else f"{rung.score:.4f}"


def curves(result: SweepResult) -> Panel:
    """One line per trial: its metric at every cycle it trained, over its rungs."""
    lines = [
        Line(f"t{trial.trial}", [point for rung in trial.rungs for point in rung.curve])
        for trial in result.trials
    ]
    return Panel(f"{result.metric} by trial", "cycle", lines)


def comparison_markdown(result: SweepResult, rungs: Sequence[int]) -> str:
    """The artifact: the table, then the picture (an inline PNG, as the flows' summaries)."""
    params = sorted({path for trial in result.trials for path in trial.params})
    rung_columns = [f"{result.metric} @ {cycles} cycles" for cycles in rungs]
    header = ["trial", *params, *rung_columns, "status", "cost", "last flow run"]
    lines = [
        f"# Sweep: {len(result.trials)} trials, {result.mode} {result.metric}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + " --- |" * len(header),
    ]
    for trial in result.trials:
        by_rung = {rung.rung: rung for rung in trial.rungs}
        cells = [
            str(trial.trial),
            *(str(trial.params.get(path, "")) for path in params),
            *(score_text(by_rung.get(index)) for index in range(len(rungs))),
            trial.status,
            format_cost(trial.cost),
            trial.last.flow_run_name,
        ]
        lines.append("| " + " | ".join(cells) + " |")
    if result.best is not None:
        lines += ["", f"Best: trial {result.best}, checkpoint `{result.best_checkpoint}`."]
    lines += ["", f"Cost of the sweep: {format_cost(result.cost)}."]
    data = base64.b64encode(render_png([curves(result)])).decode("ascii")
    lines += ["", "## Curves", "", f"![every trial's curve](data:image/png;base64,{data})"]
    return "\n".join(lines)


def summaries(
    params: Sequence[dict], rungs: dict[int, list[TrialRung]], rung_count: int, best: int | None
) -> list[TrialSummary]:
    """Every trial with its rungs and status, in trial order."""
    return [
        TrialSummary(
            trial=index,
            params=params[index],
            rungs=rungs[index],
            status=trial_status(rungs[index], rung_count, index == best),
        )
        for index in sorted(rungs)
    ]
