"""An RL flow's plug-ins resolved from its config, checked before anything is allocated.

`check_rl_config` is the Loop building blocks' fail-closed step: the loss must be one the provider
advertises (`require_advertised_loss`), the provider must offer the runs the recipe needs
(critic runs: modal and local only), the recipe must accept the loss_config keys, and every
payload the recipe builds for a probe group (the policy's, and those it sends its auxiliary
runs) must pass `validate_loss_config`, all before any session opens. The CLI runs it first
too (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flows.core.config import ConfigError, check_max_staleness, check_resume_from
from flows.core.environments import Environment, load_environment
from flows.core.environments.multiturn import (
    EnvironmentIO,
    MultiTurnEnvironment,
    environment_io,
    max_action_tokens,
)
from flows.core.environments.rendering import config_renderer, load_renderer
from flows.core.evaluation.plan import EvalPlan, load_eval_plan
from flows.core.loop.plans import derive_seed, once_per_process
from flows.rl.config import RLConfig
from flows.rl.judge_rubric import Rubric
from flows.rl.recipes import (
    CRITIC_PROVIDERS,
    AuxiliaryRun,
    Recipe,
    load_recipe,
    parse_loss_settings,
)
from flows.rl.recipes.context import LossContext
from flows.rl.recipes.reference_kl import with_reference_kl
from whitney.errors import InvalidLossConfig, Unprocessable
from whitney.losses import PROVIDER_LOSS_SUPPORT, require_advertised_loss, validate_loss_config
from whitney.payloads import sample_request
from whitney.renderers import Prompt, Renderer, as_messages


@dataclass(frozen=True)
class RLPlan:
    """The recipe, environment and renderer (with its tokenizer) of an RL config."""

    config: RLConfig
    recipe: Recipe
    environment: Environment | MultiTurnEnvironment
    renderer: Renderer
    evaluation: EvalPlan | None = None
    """The inline evaluation's eval set (None with eval_every 0 and eval_at_start false)."""
    rubric: Rubric | None = None
    """The judge's questions (flows.rl.judge_rubric), when a judge rewards (`judge.model`)."""

    @property
    def multi_turn(self) -> bool:
        """Episodes of several turns (flows.rl.multi_turn_batch), not one completion per prompt."""
        return isinstance(self.environment, MultiTurnEnvironment)

    @property
    def io(self) -> EnvironmentIO | None:
        """How the environment's calls run when it does I/O; None: inline."""
        return environment_io(self.environment)

    @property
    def action_tokens(self) -> int:
        """The most tokens a turn samples: `max_tokens`, or the environment's
        `max_action_tokens` when lower."""
        limit = max_action_tokens(self.environment)
        return self.config.max_tokens if limit is None else min(self.config.max_tokens, limit)

    def prompt_tokens(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids: the renderer's generation prompt of its messages (text is
        one user turn; raw: BOS, where the tokenizer has one, and the text)."""
        return self.renderer.build_generation_prompt(as_messages(prompt))

    def sample_requests(self, cycle: int) -> tuple[list[Prompt], list[dict[str, Any]]]:
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
                stop_token_ids=list(self.renderer.stop_tokens),
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
        self.calls: list[tuple[str, str, dict]] = []
        """Every (run_id, kind, payload) a recipe sent, for validation."""

    def run_operation(
        self, run_id: str, kind: str, payload: dict, *, seq_id: int | None = None
    ) -> dict:
        self.calls.append((run_id, kind, payload))
        if kind in ("forward", "forward_backward"):
            lengths = [len(datum["input"]["token_ids"]) for datum in payload["data"]]
            outputs = [{"logprobs": [-1.0] * n, "values": [0.0] * n} for n in lengths]
            return {"loss": 0.0, "metrics": {}, "outputs": outputs}
        return {}

    def sampler_operation(
        self, run_id: str, sampler_id: str, kind: str, payload: dict, *, seq_id: int | None = None
    ) -> dict:
        self.calls.append((run_id, kind, payload))
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
    """Resolve the recipe, environment and renderer; ConfigError naming the field if not."""
    recipe = compose_recipe(config)
    try:
        environment = load_environment(config.env)
        environment_io(environment)
        max_action_tokens(environment)
    except (ValueError, TypeError) as error:
        raise ConfigError("env", str(error)) from None
    renderer = config_renderer(config)
    evaluates = bool(config.eval_every) or config.eval_at_start
    if evaluates and isinstance(environment, MultiTurnEnvironment):
        raise ConfigError(
            "eval_every",
            f"{config.env} is a multi-turn environment: the inline evaluation samples one "
            "completion per held-out prompt (eval_every 0: none)",
        )
    evaluation = load_eval_plan(config.eval_settings(), renderer) if evaluates else None
    rubric = load_rubric(config, isinstance(environment, MultiTurnEnvironment))
    return RLPlan(config, recipe, environment, renderer, evaluation, rubric)


def load_rubric(config: RLConfig, multi_turn: bool) -> Rubric | None:
    """The judge's questions on its renderer; ConfigError naming the `judge.*` field that is
    at fault (a judge rewards single-turn environments only)."""
    settings = config.judge
    if settings.model is None:
        return None
    if multi_turn:
        raise ConfigError(
            "judge.model",
            f"{config.env} is a multi-turn environment: a judge grades single-turn completions",
        )
    fields = ("judge.model", "judge.tokenizer", "judge.renderer")
    renderer = load_renderer(settings.model, settings.tokenizer, settings.renderer, fields)
    rubric = Rubric(settings.model, settings, renderer, config.seed)
    try:
        if settings.mode == "group":
            rubric.group_question("probe", ["a", "b"])
        else:
            rubric.item_question("probe", "a")
    except (KeyError, IndexError, ValueError) as error:
        raise ConfigError(
            "judge.template",
            f"cannot fill it ({type(error).__name__}: {error}); its fields are {{rubric}}, "
            "{prompt}, {completion} and {choices} (group: {completions} and {scale}); "
            "double a literal brace",
        ) from None
    return rubric


@dataclass(frozen=True)
class ProbeRun:
    """An auxiliary run during the probe: a made-up id, nothing allocated."""

    run_id: str
    sampler_id: str | None


def compose_recipe(config: RLConfig) -> Recipe:
    """The loss's recipe with its options bound, wrapped for the reference KL if enabled;
    ConfigError naming the field if they do not go together."""
    where = "recipe" if config.recipe else "loss"
    try:
        recipe = load_recipe(config.recipe or config.loss)
    except ValueError as error:
        raise ConfigError(where, str(error)) from None
    if config.recipe and recipe.loss_function != config.loss:
        raise ConfigError(
            "recipe", f"the {recipe.name} recipe trains {recipe.loss_function}, not {config.loss}"
        )
    if recipe.options is not None:
        if recipe.options not in RLConfig.model_fields:
            raise ConfigError(where, f"the {recipe.name} recipe wants unknown options")
        recipe = recipe.bind_options(getattr(config, recipe.options))
    if config.reference_kl.enabled:
        try:
            recipe = with_reference_kl(recipe, config.reference_kl)
        except ValueError as error:
            raise ConfigError("reference_kl", str(error)) from None
    return recipe


def probe_sequence(token: int, eos: int, transcript: bool) -> dict[str, Any]:
    """A probe group's sequence: `token` and EOS; a transcript (multi-turn): that action, an
    observation token, the action again (flows.rl.multi_turn_transcripts)."""
    if not transcript:
        return {"tokens": [token, eos], "logprobs": [-1.0, -1.0], "stop_reason": "stop"}
    return {
        "tokens": [token, eos, ord("?"), token, eos],
        "logprobs": [-1.0, -1.0, 0.0, -1.0, -1.0],
        "action_mask": [1.0, 1.0, 0.0, 1.0, 1.0],
        "stop_reason": "stop",
    }


def probe(plan: RLPlan) -> tuple[dict[str, Any], DryRunClient]:
    """The recipe's payload for a made-up group of two sequences, as a dry run, and the
    client that saw every call it made (build_loss and finish_cycle): those calls get
    placeholders, nothing reaches Whitney."""
    eos = plan.renderer.stop_tokens[0]
    request = sample_request(plan.prompt_tokens("probe"), 2, max_tokens=2)
    sample = {
        "sequences": [
            probe_sequence(ord("1"), eos, plan.multi_turn),
            probe_sequence(ord("a"), eos, plan.multi_turn),
        ],
        "prompt_tokens": len(request["prompt"]["token_ids"]),
    }
    client = DryRunClient(eos)
    ctx = LossContext(
        client=client,
        run_id="probe",
        sampler_id="probe",
        provider=plan.config.provider,
        loss_config=dict(plan.config.loss_config),
        rewards=[1.0, 0.0],
        advantages=[0.5, -0.5],
        runs={
            run.name: ProbeRun(f"probe-{run.name}", run.name if run.sampler else None)
            for run in plan.recipe.auxiliary_runs
        },
        scratch={},
    )
    payload = plan.recipe.build_loss(sample, 0, request, ctx)
    if plan.recipe.finish_cycle is not None:
        plan.recipe.finish_cycle(0, ctx)
    return payload, client


def check_auxiliary_runs(provider: str, recipe: Recipe) -> None:
    """ConfigError unless the provider offers every run the recipe needs."""
    for run in recipe.auxiliary_runs:
        if run.role == "critic" and provider not in CRITIC_PROVIDERS:
            raise ConfigError(
                "loss",
                f"the {recipe.name} recipe needs a critic run (role: critic), and {provider} "
                f"has none (critic runs: {', '.join(sorted(CRITIC_PROVIDERS))})",
            )


def validate_payload(provider: str, payload: dict[str, Any], run: AuxiliaryRun | None) -> None:
    """What the provider would refuse in a forward / forward_backward payload for the policy
    (run None) or an auxiliary run, as ConfigError; a critic's datums are not policy
    datums (it takes `values` and `returns`), so only its loss and loss_config are checked."""
    critic = run is not None and run.role == "critic"
    loss = payload["loss_function"]
    where = "the policy" if run is None else f"the {run.name} run"
    if critic and loss not in ("ppo_critic", "ppo"):
        raise ConfigError("loss", f"{where} (a critic) is sent loss_function={loss!r}")
    if not critic and loss == "ppo_critic":
        raise ConfigError("loss", f"{where} is sent ppo_critic, which needs a critic run")
    try:
        validate_loss_config(
            provider, loss, payload["loss_config"], [] if critic else payload["data"]
        )
    except InvalidLossConfig as error:
        raise ConfigError("loss_config", f"{where}: {error.message}") from None
    except Unprocessable as error:
        raise ConfigError("loss", f"{where}: {error.message}") from None


@once_per_process
def check_rl_config(config: RLConfig) -> RLPlan:
    """The plan of a config the provider will accept; ConfigError naming the field if not."""
    check_resume_from(config.resume_from, config.cycles)
    check_max_staleness(
        config.max_staleness,
        pipelined=config.pipelined,
        concurrent_sampling=config.concurrent_sampling,
    )
    try:
        require_advertised_loss(config.provider, config.loss, PROVIDER_LOSS_SUPPORT)
    except ValueError as error:
        raise ConfigError("loss", str(error)) from None
    plan = load_rl_plan(config)
    if plan.multi_turn and config.max_staleness > 0:
        raise ConfigError(
            "max_staleness",
            f"{config.env} is a multi-turn environment, which samples on-policy only (0): a "
            "turn's prompt holds the environment's answer to the turn before, so a later "
            "cycle's samples cannot be requested ahead",
        )
    check_auxiliary_runs(config.provider, plan.recipe)
    try:
        parse_loss_settings(plan.recipe, config.loss_config)
    except ValueError as error:
        raise ConfigError("loss_config", str(error)) from None
    payload, client = probe(plan)
    validate_payload(config.provider, payload, None)
    runs = {f"probe-{run.name}": run for run in plan.recipe.auxiliary_runs}
    for run_id, kind, sent in client.calls:
        if kind in ("forward", "forward_backward"):
            validate_payload(config.provider, sent, runs.get(run_id))
    return plan
