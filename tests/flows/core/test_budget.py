"""Usage, cost and budgets: token classes and prices by hand, the guard's projection, and a
distillation flow that a token or cost budget stops at the right cycle, with everything saved,
exported, finished and closed."""

from __future__ import annotations

import pytest
from flowtest_distill import small_distill_config, small_sft_teacher
from flowtest_helpers import assert_finished

from blocks import WhitneyCredentials
from flows.core.config import ConfigError
from flows.core.loop.budget import BudgetGuard, flow_cost_model
from flows.core.loop.cost import (
    Budget,
    KindPriceTable,
    PriceTable,
    format_usage,
    token_classes,
    total_tokens,
    usage_of,
)
from flows.distill.config import DistillationConfig
from flows.distill.flow import distillation_flow
from flows.distill.plan import check_distill_config
from flows.rl.config import RLConfig
from flows.rl.flow import rl_flow
from whitney import wire
from whitney.client import WhitneyClient
from whitney.local import EmbeddedWhitney

USAGE = {
    "sample": {"tokens": 120, "prefill_tokens": 20, "sampled_tokens": 100},
    "logprobs": {"tokens": 300},
    "forward": {"tokens": 50},
    "forward_backward": {"tokens": 400, "trained_tokens": 400},
    "optim_step": {"tokens": 0},
}


def test_token_classes_by_hand() -> None:
    assert token_classes(USAGE) == {"sampled": 100, "prefilled": 370, "trained": 400}
    assert total_tokens(USAGE) == 870
    assert format_usage(USAGE) == ("forward 50 · forward_backward 400 · logprobs 300 · sample 120")


def test_price_table_per_million_tokens() -> None:
    prices = PriceTable(sampled_per_million=2.0, prefilled_per_million=0.5, trained_per_million=3.0)
    assert prices.cost(USAGE) == pytest.approx((100 * 2.0 + 370 * 0.5 + 400 * 3.0) / 1e6)


def test_the_blocks_per_kind_table_prices_as_the_block_does() -> None:
    table = {"sample": 0.0002, "forward_backward": 0.0006, "logprobs": 0.0001}
    block = WhitneyCredentials(base_url="http://127.0.0.1:1", api_key="k", price_table=table)
    tokens_by_kind = {kind: counters["tokens"] for kind, counters in USAGE.items()}
    assert KindPriceTable(per_thousand=table).cost(USAGE) == pytest.approx(
        block.estimate_cost(tokens_by_kind)
    )


def test_a_saved_blocks_price_table_is_used_unless_the_config_has_one() -> None:
    table = {"sample": 0.5}
    WhitneyCredentials(base_url="http://127.0.0.1:1", api_key="k", price_table=table).save(
        "budget-test-prices", overwrite=True
    )
    from_block = flow_cost_model(None, "budget-test-prices")
    assert isinstance(from_block, KindPriceTable)
    assert from_block.cost(USAGE) == pytest.approx(0.06)
    own = PriceTable(sampled_per_million=1.0)
    assert flow_cost_model(own, "budget-test-prices") is own
    assert flow_cost_model(None, None) is None


def test_usage_of_operations_sums_by_kind() -> None:
    operations = [
        wire.Operation(run_id="r", seq_id=1, kind="logprobs", status="succeeded", usage=u)
        for u in ({"tokens": 3}, {"tokens": 4})
    ]
    assert usage_of(operations) == {"logprobs": {"tokens": 7}}


def test_the_guard_projects_the_largest_cycle_and_stops_before_crossing() -> None:
    guard = BudgetGuard(Budget(max_tokens=1000), None)
    assert guard.stop_reason(0) is None  # nothing to project from: the first cycle runs
    assert guard.stop_reason(0, estimate={"sample": {"tokens": 1001}}) is not None
    guard = BudgetGuard(Budget(max_tokens=1000), None)
    guard.add({"logprobs": {"tokens": 100}})  # set-up (eval): counted, not a cycle
    assert guard.stop_reason(0, estimate={"sample": {"tokens": 900}}) is None
    guard.add_cycle({"sample": {"tokens": 300}})
    guard.add_cycle({"sample": {"tokens": 200}})
    assert guard.tokens == 600
    assert guard.stop_reason(2) is None  # 600 + 300 (the largest cycle) <= 1000
    guard.add_cycle({"sample": {"tokens": 150}})
    reason = guard.stop_reason(3)  # 750 + 300 > 1000
    assert reason is not None and "max_tokens 1,000" in reason and "cycle 3" in reason
    assert "750 tokens used" in reason and "about 300 more" in reason
    assert guard.stopped == reason and guard.stopped_before_cycle == 3
    assert BudgetGuard(Budget(), None).stop_reason(5, estimate={"x": {"tokens": 10**9}}) is None


def test_a_cost_budget_needs_prices_and_stops_on_cost() -> None:
    with pytest.raises(ConfigError, match="budget.max_cost"):
        BudgetGuard(Budget(max_cost=1.0), None)
    guard = BudgetGuard(Budget(max_cost=1.0), PriceTable(sampled_per_million=1e6))  # $1/token
    assert guard.add_cycle({"sample": {"tokens": 1, "sampled_tokens": 1}}) == pytest.approx(1.0)
    assert guard.cost == pytest.approx(1.0)
    reason = guard.stop_reason(1)
    assert reason is not None and "max_cost" in reason


def test_a_cost_budget_without_prices_fails_before_any_session(
    whitney: EmbeddedWhitney, inspector: WhitneyClient
) -> None:
    before = len(inspector.list_sessions())
    config = DistillationConfig(
        api_url=whitney.url, base_model="local/nano", budget=Budget(max_cost=1.0)
    )
    with pytest.raises(ConfigError, match="budget.max_cost"):
        distillation_flow(config)
    assert len(inspector.list_sessions()) == before


@pytest.mark.parametrize("limit", ["max_tokens", "max_cost"])
def test_a_budget_stops_the_flow_at_the_right_cycle_with_everything_closed(
    limit: str, whitney: EmbeddedWhitney, inspector: WhitneyClient
) -> None:
    prices = PriceTable(sampled_per_million=3.0, prefilled_per_million=1.0, trained_per_million=2.0)
    config = small_distill_config(
        whitney.url,
        prompts="digits",  # no eval set: the cycles are all the flow bills
        cycles=8,
        checkpoint_every=0,
        prices=prices,
    )
    bound = check_distill_config(config).cycle_usage_bound(0)
    if limit == "max_tokens":
        budget = Budget(max_tokens=int(3.5 * total_tokens(bound)))
    else:
        budget = Budget(max_cost=3.5 * prices.cost(bound))
    result = distillation_flow(config.model_copy(update={"budget": budget}))

    ran = len(result.cycles)
    assert 0 < ran < config.cycles
    assert result.budget_stop is not None
    assert f"stopped before cycle {ran}" in result.budget_stop and limit in result.budget_stop

    def measure(usage: dict) -> float:
        return total_tokens(usage) if limit == "max_tokens" else prices.cost(usage)

    cap = budget.max_tokens if limit == "max_tokens" else budget.max_cost
    per_cycle = [measure(m.usage) for m in result.cycles]
    for cycle in range(ran + 1):  # the rule, replayed from the cycles' own usage
        used = sum(per_cycle[:cycle])
        projected = max(per_cycle[:cycle]) if cycle else measure(bound)
        assert (used + projected > cap) == (cycle == ran), (cycle, used, projected, cap)
    if limit == "max_cost":
        assert result.cost == pytest.approx(sum(per_cycle))
        assert [m.cost for m in result.cycles] == pytest.approx(per_cycle)
    assert result.total_tokens == sum(total_tokens(m.usage) for m in result.cycles)

    # stopped cleanly: saved, exported, finished, closed
    assert result.checkpoint.endswith(f"/states/cycle-{ran - 1}")
    assert len(result.adapter.sha256) == 64
    assert_finished(inspector, result.session_id)


def test_the_sft_teachers_tokens_count_toward_the_distillation_budget(
    whitney: EmbeddedWhitney, inspector: WhitneyClient
) -> None:
    config = small_distill_config(
        whitney.url,
        prompts="digits",
        cycles=3,
        checkpoint_every=0,
        teacher_sft=small_sft_teacher(steps=2),
    )
    # a budget the cycles alone would fit in twice over, but not after the teacher's training
    one_cycle = total_tokens(check_distill_config(config).cycle_usage_bound(0))
    result = distillation_flow(
        config.model_copy(update={"budget": Budget(max_tokens=2 * one_cycle)})
    )
    sft_tokens = total_tokens(result.usage["teacher_sft"])
    assert sft_tokens > 2 * one_cycle
    assert result.cycles == []
    assert result.budget_stop is not None and "stopped before cycle 0" in result.budget_stop
    assert f"{sft_tokens:,} tokens used" in result.budget_stop
    assert_finished(inspector, result.session_id)


def test_the_rl_flow_stops_on_its_budget_after_the_first_cycle(
    small_config: RLConfig, inspector: WhitneyClient
) -> None:
    prices = PriceTable(sampled_per_million=1.0, trained_per_million=1.0)
    # The first cycle always runs (there is nothing to project from); one token is less
    # than any cycle, so the flow stops before cycle 1.
    config = small_config.model_copy(
        update={"cycles": 4, "budget": Budget(max_tokens=1), "prices": prices}
    )
    result = rl_flow(config)
    assert [metrics.cycle for metrics in result.cycles] == [0]
    assert result.budget_stop is not None and "before cycle 1" in result.budget_stop
    assert result.usage == result.cycles[0].usage
    assert total_tokens(result.usage) > 1
    assert result.cost == pytest.approx(prices.cost(result.usage))
    assert result.cycles[0].cost == pytest.approx(result.cost)
    assert result.checkpoint.endswith("/states/cycle-0")
    assert_finished(inspector, result.session_id)
