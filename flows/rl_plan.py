"""An RL flow's plug-ins resolved from its config, checked before anything is allocated.

`check_rl_config` is the page's fail-closed step: the loss must be one the provider
advertises (`require_advertised_loss`), and the recipe's payload for a probe group must pass
`validate_loss_config`, both before any session opens. The CLI runs it first too (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flows.config import ConfigError, RLConfig
from flows.context import LossContext
from flows.environments import Environment, load_environment
from flows.recipes import Recipe, load_recipe
from flows.seeds import derive_seed
from whitney.errors import InvalidLossConfig, Unprocessable
from whitney.losses import PROVIDER_LOSS_SUPPORT, require_advertised_loss, validate_loss_config
from whitney.payloads import sample_request
from whitney.tokenizers import Tokenizer, get_tokenizer


@dataclass(frozen=True)
class RLPlan:
    """The recipe, environment and tokenizer of an RL config."""

    config: RLConfig
    recipe: Recipe
    environment: Environment
    tokenizer: Tokenizer

    def prompt_tokens(self, prompt: str) -> list[int]:
        """The prompt's token ids, after the tokenizer's BOS where it has one."""
        bos = getattr(self.tokenizer, "bos_id", None)
        return ([bos] if bos is not None else []) + self.tokenizer.encode(prompt)

    def sample_requests(self, cycle: int) -> tuple[list[str], list[dict[str, Any]]]:
        """The cycle's prompts and one SampleRequest per prompt (group_size samples each),
        seeded from (config seed, cycle, prompt index)."""
        config = self.config
        prompts = self.environment.prompts(
            cycle, config.prompts_per_cycle, derive_seed(config.seed, cycle)
        )
        requests = [
            sample_request(
                self.prompt_tokens(prompt),
                config.group_size,
                max_tokens=config.max_tokens,
                temperature=config.temperature,
                stop_token_ids=[self.tokenizer.eos_id],
                seed=derive_seed(config.seed, cycle, index),
            )
            for index, prompt in enumerate(prompts)
        ]
        return prompts, requests


class DryRunClient:
    """`ctx.client` during the probe: nothing is sent before validation passes. Calls a recipe
    makes are answered with placeholders of the right shape (logprobs -1.0, values 0.0)."""

    def __init__(self, eos_id: int) -> None:
        self.eos_id = eos_id

    def run_operation(
        self, run_id: str, kind: str, payload: dict, *, seq_id: int | None = None
    ) -> dict:
        if kind in ("forward", "forward_backward"):
            lengths = [len(datum["input"]["token_ids"]) for datum in payload["data"]]
            outputs = [{"logprobs": [-1.0] * n, "values": [0.0] * n} for n in lengths]
            return {"loss": 0.0, "metrics": {}, "outputs": outputs}
        return {}

    def sampler_operation(
        self, run_id: str, sampler_id: str, kind: str, payload: dict, *, seq_id: int | None = None
    ) -> dict:
        if kind == "logprobs":
            lengths = [len(sequence["token_ids"]) for sequence in payload["sequences"]]
            return {"logprobs": [[None] + [-1.0] * (n - 1) for n in lengths]}
        if kind == "sample":
            sequence = {"tokens": [self.eos_id], "logprobs": [-1.0], "stop_reason": "stop"}
            prompt_tokens = len(payload["prompt"]["token_ids"])
            return {
                "sequences": [sequence] * payload["num_samples"],
                "prompt_tokens": prompt_tokens,
            }
        return {}


def load_rl_plan(config: RLConfig) -> RLPlan:
    """Resolve the recipe, environment and tokenizer; ConfigError naming the field if not."""
    try:
        recipe = load_recipe(config.loss)
    except ValueError as error:
        raise ConfigError("loss", str(error)) from None
    try:
        environment = load_environment(config.env)
    except ValueError as error:
        raise ConfigError("env", str(error)) from None
    try:
        tokenizer = get_tokenizer(config.base_model)
    except ValueError as error:
        raise ConfigError("base_model", str(error)) from None
    return RLPlan(config, recipe, environment, tokenizer)


def probe_payload(plan: RLPlan) -> dict[str, Any]:
    """The recipe's payload for a made-up group of two sequences, as a dry run: calls it
    makes through ctx get placeholders, nothing reaches Whitney."""
    eos = plan.tokenizer.eos_id
    request = sample_request(plan.prompt_tokens("probe"), 2, max_tokens=2)
    sample = {
        "sequences": [
            {"tokens": [ord("1"), eos], "logprobs": [-1.0, -1.0], "stop_reason": "stop"},
            {"tokens": [ord("a"), eos], "logprobs": [-1.0, -1.0], "stop_reason": "stop"},
        ],
        "prompt_tokens": len(request["prompt"]["token_ids"]),
    }
    ctx = LossContext(
        client=DryRunClient(eos),
        run_id="probe",
        sampler_id="probe",
        provider=plan.config.provider,
        loss_config=dict(plan.config.loss_config),
        rewards=[1.0, 0.0],
        advantages=[0.5, -0.5],
    )
    return plan.recipe.build_loss(sample, 0, request, ctx)


def check_rl_config(config: RLConfig) -> RLPlan:
    """The plan of a config the provider will accept; ConfigError naming the field if not."""
    try:
        require_advertised_loss(config.provider, config.loss, PROVIDER_LOSS_SUPPORT)
    except ValueError as error:
        raise ConfigError("loss", str(error)) from None
    plan = load_rl_plan(config)
    payload = probe_payload(plan)
    try:
        validate_loss_config(
            config.provider, payload["loss_function"], payload["loss_config"], payload["data"]
        )
    except InvalidLossConfig as error:
        raise ConfigError("loss_config", error.message) from None
    except Unprocessable as error:
        raise ConfigError("loss", error.message) from None
    return plan
