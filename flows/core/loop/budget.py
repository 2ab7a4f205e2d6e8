"""Budgets: stop a flow cleanly before the cycle that would take it over `max_tokens` or
`max_cost`.

Before each cycle the flow asks `BudgetGuard.stop_reason(cycle)`: the tokens (and estimated
cost) used so far, plus a projection of the next cycle, against the budget. The projection is
the largest cycle so far; before the first cycle, an upper bound the flow computes from its
config (every completion at max_tokens), or nothing (the first cycle then always runs). A
flow that stops ends normally: save_state, export_lora, finish, close, and its summary and
logs say why it stopped.
"""

from __future__ import annotations

from collections.abc import Mapping

from blocks.endpoint import load_block
from flows.core.config import ConfigError
from flows.core.loop.cost import (
    Budget,
    CostModel,
    PriceTable,
    Usage,
    add_usage,
    cost_model,
    total_tokens,
)


def flow_cost_model(prices: PriceTable | None, whitney_block: str | None) -> CostModel | None:
    """The config's price table, else the credentials block's (when the flow names one)."""
    if prices is not None or not whitney_block:
        return cost_model(prices)
    return cost_model(None, load_block(whitney_block).price_table)


def check_budget(budget: Budget, prices: CostModel | None) -> None:
    """ConfigError when `max_cost` is set but nothing prices the tokens."""
    if budget.max_cost is not None and prices is None:
        raise ConfigError(
            "budget.max_cost",
            "needs a price table: set `prices` in the config or `price_table` in the "
            "WhitneyCredentials block",
        )


class BudgetGuard:
    """The flow run's usage so far, and whether the next cycle still fits its budget."""

    def __init__(self, budget: Budget, prices: CostModel | None) -> None:
        check_budget(budget, prices)
        self.budget = budget
        self.prices = prices
        self.used: Usage = {}
        self.cycles = 0
        self._largest_cycle_tokens = 0
        self._largest_cycle_cost = 0.0
        self.stopped: str | None = None
        self.stopped_before_cycle: int | None = None

    @property
    def tokens(self) -> int:
        return total_tokens(self.used)

    @property
    def cost(self) -> float | None:
        """Estimated USD so far; None without a price table."""
        return None if self.prices is None else self.prices.cost(self.used)

    def cost_of(self, usage: Mapping[str, Mapping[str, int]]) -> float | None:
        return None if self.prices is None else self.prices.cost(usage)

    def add(self, usage: Mapping[str, Mapping[str, int]]) -> None:
        """Usage outside the cycles (set-up, evaluation, the final checkpoint)."""
        add_usage(self.used, usage)

    def add_cycle(self, usage: Mapping[str, Mapping[str, int]]) -> float | None:
        """A finished cycle's usage; returns its estimated cost (None without prices)."""
        add_usage(self.used, usage)
        self.cycles += 1
        self._largest_cycle_tokens = max(self._largest_cycle_tokens, total_tokens(usage))
        cost = self.cost_of(usage)
        if cost is not None:
            self._largest_cycle_cost = max(self._largest_cycle_cost, cost)
        return cost

    def projection(
        self, estimate: Mapping[str, Mapping[str, int]] | None = None
    ) -> tuple[int, float | None] | None:
        """(tokens, cost) expected of the next cycle: the largest cycle so far, else
        `estimate`, else None."""
        if self.cycles:
            cost = self._largest_cycle_cost if self.prices is not None else None
            return self._largest_cycle_tokens, cost
        if estimate is None:
            return None
        return total_tokens(estimate), self.cost_of(estimate)

    def stop_reason(
        self, cycle: int, estimate: Mapping[str, Mapping[str, int]] | None = None
    ) -> str | None:
        """Why cycle `cycle` must not run (and the guard records it), or None."""
        if not self.budget.active:
            return None
        projected = self.projection(estimate)
        if projected is None:
            return None
        next_tokens, next_cost = projected
        reason = None
        max_tokens, max_cost = self.budget.max_tokens, self.budget.max_cost
        if max_tokens is not None and self.tokens + next_tokens > max_tokens:
            reason = (
                f"budget: stopped before cycle {cycle}: {self.tokens:,} tokens used, and the "
                f"next cycle would take about {next_tokens:,} more, over max_tokens "
                f"{max_tokens:,}"
            )
        elif max_cost is not None and next_cost is not None:
            used_cost = self.cost or 0.0
            if used_cost + next_cost > max_cost:
                reason = (
                    f"budget: stopped before cycle {cycle}: ${used_cost:,.4f} spent, and the "
                    f"next cycle would cost about ${next_cost:,.4f} more, over max_cost "
                    f"${max_cost:,.4f}"
                )
        if reason is not None:
            self.stopped = reason
            self.stopped_before_cycle = cycle
        return reason
