"""The sweep's plan with no server: grid and seeded random expansion, the trials' configs at a
rung, field validation, which trials a rung keeps, the budget ledger, and the comparison
table, how many cycles a trial is read back to. Expected values are written out by hand here."""

from __future__ import annotations

import base64
import math
import random
import struct
import zlib

import pytest

from flows.core.config import ConfigError
from flows.rl.config import RLConfig
from flows.sweep.comparison import comparison_markdown, summaries
from flows.sweep.config import SweepConfig
from flows.sweep.ledger import CostLedger
from flows.sweep.plan import (
    Trial,
    best_trial,
    check_sweep_config,
    expand,
    has_field,
    survivors,
    trial_settings,
)
from flows.sweep.results import SKIPPED, SweepResult, TrialRung
from flows.sweep.trials import TrialRequest, cycles_ran


def grid(**extra: object) -> SweepConfig:
    return SweepConfig.model_validate(
        {"grid": {"learning_rate": [0.001, 0.01], "lora_rank": [4, 8, 16]}, **extra}
    )


def test_a_grid_is_every_combination_the_last_field_fastest() -> None:
    trials = check_sweep_config(grid(rungs=[2, 4]))
    assert [trial.params for trial in trials] == [
        {"learning_rate": 0.001, "lora_rank": 4},
        {"learning_rate": 0.001, "lora_rank": 8},
        {"learning_rate": 0.001, "lora_rank": 16},
        {"learning_rate": 0.01, "lora_rank": 4},
        {"learning_rate": 0.01, "lora_rank": 8},
        {"learning_rate": 0.01, "lora_rank": 16},
    ]
    assert [trial.index for trial in trials] == list(range(6))


def test_a_random_search_draws_the_same_trials_from_the_same_seed() -> None:
    config = SweepConfig.model_validate(
        {
            "search": "random",
            "samples": 4,
            "seed": 11,
            "random": {
                "learning_rate": {"low": 1e-4, "high": 1e-2, "log": True},
                "lora_rank": {"values": [4, 8, 16]},
                "group_size": {"low": 2, "high": 9, "integer": True},
            },
        }
    )
    rng = random.Random(11)
    expected = []
    for _ in range(4):  # the fields in alphabetical order, one draw each, trial after trial
        size = round(rng.uniform(2, 9))
        rate = math.exp(rng.uniform(math.log(1e-4), math.log(1e-2)))
        rank = rng.choice([4, 8, 16])
        expected.append({"group_size": size, "learning_rate": rate, "lora_rank": rank})
    assert [trial.params for trial in check_sweep_config(config)] == expected
    assert expand(config) == expand(config)
    other = expand(config.model_copy(update={"seed": 12}))
    assert [trial.params for trial in other] != expected
    assert all(1e-4 <= trial.params["learning_rate"] <= 1e-2 for trial in other)


def test_a_trial_config_at_a_rung_is_base_then_its_values_then_its_length() -> None:
    config = grid(base={"seed": 7, "critic": {"gamma": 0.9}, "lora_rank": 2}, rungs=[2, 5])
    trial = Trial(3, {"lora_rank": 8, "critic.gae_lambda": 0.5})
    checkpoint = "whitney://runs/run-1/states/cycle-1"
    assert trial_settings(config, trial, 5, checkpoint) == {
        "seed": 7,
        "critic": {"gamma": 0.9, "gae_lambda": 0.5},
        "lora_rank": 8,
        "cycles": 5,
        "resume_from": checkpoint,
    }
    sft = SweepConfig.model_validate(
        {"kind": "sft", "grid": {"steps_per_cycle": [3, 4]}, "rungs": [1, 2]}
    )
    first, second = check_sweep_config(sft)
    assert trial_settings(sft, first, 2, None) == {"steps_per_cycle": 3, "steps": 6}
    assert trial_settings(sft, second, 1, None)["steps"] == 4


@pytest.mark.parametrize(
    ("settings", "field", "words"),
    [
        ({"grid": {"lora.rank": [4]}}, "grid.lora.rank", "RLConfig has no field 'lora.rank'"),
        ({"grid": {"critic.nope": [1]}}, "grid.critic.nope", "no field"),
        ({"grid": {"seed": [1]}, "base": {"typo": 1}}, "base.typo", "no field 'typo'"),
        ({"grid": {"cycles": [3]}}, "grid.cycles", "the sweep sets it"),
        ({"grid": {"resume_from": ["x"]}}, "grid.resume_from", "the sweep sets it"),
        ({"grid": {"seed": []}}, "grid.seed", "no value"),
        ({"grid": {}}, "grid", "nothing to search"),
        ({"search": "random", "grid": {"seed": [1]}}, "random", "nothing to search"),
        ({"grid": {"seed": [1]}, "rungs": [4, 4]}, "rungs", "must increase"),
        ({"grid": {"seed": [1]}, "kind": "dpo2"}, "kind", "unknown training flow 'dpo2'"),
        ({"grid": {"learning_rate": [0.1, 7.0]}}, "learning_rate", "trial 1"),
        ({"kind": "sft", "grid": {"epochs": [1]}}, "grid.epochs", "the sweep sets it"),
    ],
)
def test_a_bad_sweep_is_refused_naming_the_field(
    settings: dict[str, object], field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        check_sweep_config(SweepConfig.model_validate(settings))
    assert refused.value.field == field
    assert words in str(refused.value)


def test_field_paths_reach_nested_models_and_mapping_keys() -> None:
    assert has_field(RLConfig, "critic.gae_lambda")
    assert has_field(RLConfig, "loss_config.clip_low")
    assert has_field(RLConfig, "budget.max_cost")  # a model behind an Annotated
    assert has_field(RLConfig, "prices.trained_per_million")  # behind `| None`
    assert not has_field(RLConfig, "loss_config.a.b")
    assert not has_field(RLConfig, "seed.value")


def test_a_rung_keeps_the_best_share_and_never_a_failed_trial() -> None:
    scores = {0: 0.25, 1: 0.5, 2: None, 3: 0.5, 4: 0.0, 5: 0.75}
    assert survivors(scores, "max", 0.5) == [1, 3, 5]  # 3 of 6: 0.75, then the tie 0.5
    assert survivors(scores, "max", 0.3) == [1, 5]  # ceil(1.8) = 2: the tie to trial 1
    assert survivors(scores, "min", 0.5) == [0, 1, 4]  # 0.0, 0.25, then the tie 0.5
    assert survivors(scores, "max", 0.01) == [5]  # at least one
    assert survivors({0: None, 1: None}, "max", 0.5) == []
    assert best_trial(scores, "max") == 5 and best_trial(scores, "min") == 4
    assert best_trial({0: None}, "max") is None


def test_the_ledger_starts_a_rung_only_within_max_cost() -> None:
    ledger = CostLedger(max_cost=1.0)
    assert ledger.reserve("a", 2) and ledger.reserve("b", 2)  # no estimate yet: both start
    ledger.settle("a", 0.3, 2)  # 0.15 a cycle
    assert ledger.reserve("c", 2)  # 0.3 spent + 0 held by b + 0.3 projected <= 1.0
    ledger.settle("b", 0.2, 2)
    assert not ledger.reserve("d", 2)  # 0.5 spent + 0.3 held by c + 0.3 > 1.0
    ledger.settle("c", 0.1, 2)
    assert ledger.reserve("e", 2) and not ledger.reserve("f", 1)  # 0.6 + 0.3, then + 0.15
    unlimited = CostLedger(max_cost=None)
    unlimited.settle("x", 100.0, 1)
    assert unlimited.reserve("y", 1000)


def rung(trial: int, index: int, state: str = "COMPLETED", score: float | None = 0.5) -> TrialRung:
    cycles = 2 * (index + 1)
    return TrialRung(
        trial=trial,
        rung=index,
        cycles=cycles,
        flow_run_name=f"sweep-trial-{trial}-rung-{index}",
        state=state,
        curve=[(cycles - 2, 0.1 * trial), (cycles - 1, score or 0.0)],
        score=score if state == "COMPLETED" else None,
        checkpoint=f"whitney://runs/r{trial}{index}/states/cycle-{cycles - 1}",
        cost=0.01,
    )


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_comparison_lists_every_trial_with_how_it_ended() -> None:
    rungs = {
        0: [rung(0, 0), rung(0, 1, score=0.9)],
        1: [rung(1, 0, score=0.1)],
        2: [rung(2, 0, state="FAILED")],
        3: [rung(3, 0), rung(3, 1, score=0.4)],
        4: [rung(4, 0, state=SKIPPED)],
    }
    params = [{"learning_rate": 0.001 * (i + 1)} for i in range(5)]
    result = SweepResult(
        metric="reward_mean",
        mode="max",
        trials=summaries(params, rungs, 2, best=0),
        best=0,
        best_checkpoint="whitney://runs/r01/states/cycle-3",
        cost=0.07,
    )
    text = comparison_markdown(result, [2, 4])
    lines = text.splitlines()
    header = "| trial | learning_rate | reward_mean @ 2 cycles | reward_mean @ 4 cycles | status"
    assert lines[2].startswith(header)
    rows = [line for line in lines if line.startswith("| ") and line[2].isdigit()]
    assert [row.split(" | ")[4] for row in rows] == [
        "best",
        "stopped at rung 0",
        "failed at rung 0",
        "finished",
        "skipped at rung 0 (max_cost)",
    ]
    assert rows[0].startswith("| 0 | 0.001 | 0.5000 | 0.9000 | best | $0.0200 |")
    assert "checkpoint `whitney://runs/r01/states/cycle-3`" in text
    data = text.split("data:image/png;base64,", 1)[1].rstrip(")")
    png = base64.b64decode(data)
    assert png_size(png) == (480, 300)
    zlib.decompress(png[png.index(b"IDAT") + 4 :])  # a complete image stream


def test_trials_do_not_depend_on_the_order_the_fields_are_written() -> None:
    """A Prefect server on PostgreSQL stores parameters as JSONB, which keeps no key order:
    the same grid or random fields written in another order give the same numbered trials."""
    grid = {"learning_rate": [0.002, 0.05], "lora_rank": [4, 8]}
    written = SweepConfig(kind="rl", grid=grid, rungs=[1])
    reordered = SweepConfig(kind="rl", grid=dict(reversed(grid.items())), rungs=[1])
    assert expand(written) == expand(reordered)
    assert [trial.params["lora_rank"] for trial in expand(written)] == [4, 8, 4, 8]


def test_a_trial_is_read_back_up_to_the_cycle_its_final_checkpoint_names() -> None:
    """A trial its own budget stopped early leaves fewer cycle events than its rung: the sweep
    waits for those its final checkpoint (`states/cycle-n`, the state after cycle n) names."""
    request = TrialRequest(
        trial=0,
        rung=0,
        cycles=4,
        deployment="rl/rl",
        parameters={},
        flow_run_name="s-trial-0-rung-0",
        sweep_flow_run_id="s",
        concurrency_limit="s",
        metric="reward_mean",
        first_cycle=0,
        timeout_s=60.0,
    )
    assert cycles_ran(request, "whitney://runs/r01/states/cycle-3") == 4
    assert cycles_ran(request, "whitney://runs/r01/states/cycle-0") == 1
    resumed = request.model_copy(update={"first_cycle": 2})
    assert cycles_ran(resumed, "whitney://runs/r01/states/cycle-2") == 1
    assert cycles_ran(request, "whitney://runs/r01/states/final") == 4  # no cycle: the rung's
