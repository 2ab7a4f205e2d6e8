"""Datums for multi-turn transcripts, checked against a hand-built episode: one datum while
each prompt extends the transcript (split otherwise), action tokens with weight 1, their
sampled logprobs and the episode's advantage, observation tokens with weight 0, in every
recipe (the eight losses and the reference KL); and on the real engine, observation tokens
change no loss."""

from __future__ import annotations

import math
from typing import Any

import pytest

from flows.rl.config import ReferenceKLSettings, RLConfig
from flows.rl.multi_turn_transcripts import Turn, first_prompt, next_prompt, transcript_sequences
from flows.rl.plan import DryRunClient, check_rl_config
from flows.rl.recipes import load_recipe
from flows.rl.recipes.context import LossContext
from flows.rl.recipes.reference_kl import with_reference_kl
from whitney.client import WhitneyClient
from whitney.losses import LOSS_FUNCTIONS
from whitney.payloads import sample_request
from whitney.renderers import QwenRenderer, RawRenderer
from whitney.tokenizers import ByteTokenizer

# The hand-built episode: BOS "N: ", the action "12"+EOS, the observation "\nok ", the
# action "a"+EOS.
PROMPT = [256, 78, 58, 32]
ACTION_0, LOGPROBS_0 = [49, 50, 257], [-0.5, -0.25, -0.125]
OBSERVATION = [10, 111, 107, 32]
ACTION_1, LOGPROBS_1 = [97, 257], [-1.0, -0.0625]
ADVANTAGE = 0.75
TURNS = [
    Turn(tuple(PROMPT), tuple(ACTION_0), tuple(LOGPROBS_0), "stop", 5),
    Turn(tuple(PROMPT + ACTION_0 + OBSERVATION), tuple(ACTION_1), tuple(LOGPROBS_1), "stop", 9),
]
# The one datum, written out position by position: input = prompt + transcript minus the last
# token, targets shifted by one; the first 3 targets are the prompt's.
INPUT = [256, 78, 58, 32, 49, 50, 257, 10, 111, 107, 32, 97]
TARGETS = [78, 58, 32, 49, 50, 257, 10, 111, 107, 32, 97, 257]
WEIGHTS = [0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1]
LOGPROBS = [0, 0, 0, -0.5, -0.25, -0.125, 0, 0, 0, 0, -1.0, -0.0625]
ADVANTAGES = [0, 0, 0, 0.75, 0.75, 0.75, 0, 0, 0, 0, 0.75, 0.75]
ACTION_POSITIONS = [3, 4, 5, 10, 11]


def values(datum: dict[str, Any], name: str) -> list[float]:
    return datum["loss_inputs"][name]["values"]


def transcript_call() -> tuple[dict[str, Any], dict[str, Any]]:
    """The episode as a build_loss call: (sample, request), a group of one episode."""
    (segment,) = transcript_sequences(TURNS)
    return {"sequences": [segment.sequence]}, sample_request(segment.prompt, 1, max_tokens=4)


class ScriptedClient(DryRunClient):
    """`ctx.client` answering a reference's logprobs and a critic's values with fixed
    numbers: logprob -2.0 everywhere, value 0.1 x position."""

    def sampler_operation(self, run_id: str, sampler_id: str, kind: str, payload: dict, **_: Any):
        self.calls.append((run_id, kind, payload))
        lengths = [len(sequence["token_ids"]) for sequence in payload["sequences"]]
        return {"logprobs": [[None] + [-2.0] * (n - 1) for n in lengths]}

    def run_operation(self, run_id: str, kind: str, payload: dict, **_: Any) -> dict:
        self.calls.append((run_id, kind, payload))
        if kind == "optim_step":
            return {}
        lengths = [len(datum["input"]["token_ids"]) for datum in payload["data"]]
        return {
            "loss": 0.0,
            "metrics": {},
            "outputs": [{"values": [0.1 * t for t in range(n)]} for n in lengths],
        }


class Run:
    def __init__(self, run_id: str, sampler_id: str | None) -> None:
        self.run_id, self.sampler_id = run_id, sampler_id


def context(provider: str = "local", **options: Any) -> LossContext:
    return LossContext(
        client=options.pop("client", ScriptedClient(eos_id=257)),
        run_id="policy",
        sampler_id="sampler",
        provider=provider,
        loss_config={},
        rewards=[1.0],
        advantages=[ADVANTAGE],
        runs={"reference": Run("reference", "reference"), "critic": Run("critic", None)},
        scratch={},
    )


def test_the_raw_renderer_starts_with_bos_then_appends_each_action_and_observation() -> None:
    transcript = first_prompt(RawRenderer(ByteTokenizer()), "N: ")
    assert transcript.tokens == PROMPT
    reply = transcript.add_completion(ACTION_0, LOGPROBS_0)
    assert reply == {"role": "assistant", "content": "12"}
    assert next_prompt(transcript, "\nok ") == list(TURNS[1].prompt)


def test_an_action_cut_at_max_tokens_is_closed_with_eos_before_the_observation() -> None:
    transcript = first_prompt(RawRenderer(ByteTokenizer()), "N: ")
    transcript.add_completion([49, 50], [-0.5, -0.25])  # "12", no EOS: stop reason length
    assert next_prompt(transcript, "\nok ") == PROMPT + [49, 50, 257] + OBSERVATION
    assert transcript.mask == [0.0] * 4 + [1.0, 1.0] + [0.0] * 5


class ChatMLBytes(ByteTokenizer):
    """Bytes, with ChatML's two special tokens (ids past the bytes')."""

    def token_id(self, token: str) -> int | None:
        return {"<|im_start|>": 300, "<|im_end|>": 301}.get(token)


def test_a_chat_renderer_writes_each_observation_as_a_message_after_the_action() -> None:
    renderer = QwenRenderer(ChatMLBytes())
    transcript = first_prompt(renderer, [{"role": "tool", "content": "3"}])
    opened = list(transcript.tokens)
    transcript.add_completion([52, *renderer.stop_tokens], [-1.0, -0.5])
    prompt = next_prompt(transcript, "ok")
    assert prompt[: len(opened) + 2] == opened + [52, *renderer.stop_tokens]
    messages = [
        {"role": "tool", "content": "3"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "ok"},
    ]
    assert prompt == renderer.build_generation_prompt(messages)


def test_the_segment_trains_what_the_renderers_transcript_datum_trains() -> None:
    """One way to a datum: the importance_sampling recipe's datum of the episode's segment
    equals `Transcript.datum` of the same turns (whitney.renderers)."""
    transcript = first_prompt(RawRenderer(ByteTokenizer()), "N: ")
    transcript.add_completion(ACTION_0, LOGPROBS_0)
    next_prompt(transcript, "\nok ")
    transcript.add_completion(ACTION_1, LOGPROBS_1)
    sample, request = transcript_call()
    (datum,) = load_recipe("importance_sampling").build_loss(sample, 0, request, context())["data"]
    assert datum == transcript.datum(ADVANTAGE)


def test_one_segment_while_each_prompt_extends_the_transcript() -> None:
    (segment,) = transcript_sequences(TURNS)
    assert segment.prompt == PROMPT
    assert segment.sequence == {
        "tokens": ACTION_0 + OBSERVATION + ACTION_1,
        "logprobs": LOGPROBS_0 + [0.0] * 4 + LOGPROBS_1,
        "action_mask": [1.0] * 3 + [0.0] * 4 + [1.0] * 2,
        "stop_reason": "stop",
    }


def test_a_prompt_that_does_not_extend_the_transcript_starts_a_new_segment() -> None:
    rewritten = Turn(tuple(PROMPT + OBSERVATION), tuple(ACTION_1), tuple(LOGPROBS_1), "length", 9)
    first, second = transcript_sequences([TURNS[0], rewritten])
    assert (first.prompt, first.sequence["tokens"]) == (PROMPT, ACTION_0)
    assert first.sequence["action_mask"] == [1.0] * 3
    assert (second.prompt, second.sequence["tokens"]) == (PROMPT + OBSERVATION, ACTION_1)
    assert (second.sequence["action_mask"], second.sequence["stop_reason"]) == ([1.0] * 2, "length")


@pytest.mark.parametrize("loss", ["importance_sampling", "ppo", "cispo", "dro", "gspo", "dppo"])
@pytest.mark.parametrize("provider", ["local", "tinker"])
def test_policy_losses_weigh_only_the_actions(loss: str, provider: str) -> None:
    if provider == "tinker" and loss in ("gspo", "dppo"):
        pytest.skip("not served on tinker")
    sample, request = transcript_call()
    payload = load_recipe(loss).build_loss(sample, 0, request, context(provider))
    (datum,) = payload["data"]
    assert datum["input"]["token_ids"] == INPUT
    assert values(datum, "target_tokens") == TARGETS
    assert values(datum, "weights") == WEIGHTS
    assert values(datum, "logprobs") == LOGPROBS
    assert values(datum, "advantages") == ADVANTAGES
    if loss == "gspo":
        assert values(datum, "sequence_ratio_mask") == WEIGHTS
    if provider == "tinker" and loss in ("ppo", "cispo"):
        assert len(values(datum, "clip_low_threshold")) == len(INPUT)


def test_cross_entropy_supervises_only_the_actions_of_a_better_episode() -> None:
    sample, request = transcript_call()
    recipe = load_recipe("cross_entropy")
    (better,) = recipe.build_loss(sample, 0, request, context())["data"]
    assert (better["input"]["token_ids"], values(better, "weights")) == (INPUT, WEIGHTS)
    worse_context = context()
    worse_context = LossContext(**{**worse_context.__dict__, "advantages": [-0.5]})
    (worse,) = recipe.build_loss(sample, 0, request, worse_context)["data"]
    assert values(worse, "weights") == [0.0] * len(INPUT)


@pytest.mark.parametrize("length_normalize", [False, True])
def test_reference_kl_adjusts_only_the_actions(length_normalize: bool) -> None:
    settings = ReferenceKLSettings(enabled=True, kl_coef=0.5, length_normalize=length_normalize)
    recipe = with_reference_kl(load_recipe("importance_sampling"), settings)
    sample, request = transcript_call()
    ctx = context()
    (datum,) = recipe.build_loss(sample, 0, request, ctx)["data"]
    (reference_call,) = ctx.client.calls
    assert reference_call[2] == {
        "sequences": [{"token_ids": PROMPT + sample["sequences"][0]["tokens"]}]
    }
    advantage = ADVANTAGE / 5 if length_normalize else ADVANTAGE  # 5 sampled tokens
    expected = [0.0] * len(INPUT)
    for position in ACTION_POSITIONS:
        expected[position] = advantage - 0.5 * (LOGPROBS[position] + 2.0)
    assert values(datum, "advantages") == pytest.approx(expected)
    assert values(datum, "weights") == WEIGHTS
    metrics = recipe.finish_cycle(0, ctx)
    action_logprobs = [LOGPROBS[position] for position in ACTION_POSITIONS]
    assert metrics["reference_kl"] == pytest.approx(sum(lp + 2.0 for lp in action_logprobs) / 5)


def test_ppo_critic_runs_gae_over_the_actions_and_trains_the_critic_on_them() -> None:
    recipe = load_recipe("ppo_critic")
    sample, request = transcript_call()
    ctx = context()
    options = RLConfig().critic.model_copy(update={"normalize_advantages": False})
    (datum,) = recipe.build_loss(sample, 0, request, ctx, options=options)["data"]
    # the critic's value before each target is 0.1 x its input position; GAE with gamma 1,
    # lambda 0.95 over the 5 sampled tokens in order, reward 1 on the last, 0 after it
    value = [0.1 * position for position in ACTION_POSITIONS]
    advantages, running = [0.0] * 5, 0.0
    for j in reversed(range(5)):
        following = value[j + 1] if j < 4 else 0.0
        running = (1.0 if j == 4 else 0.0) + following - value[j] + 0.95 * running
        advantages[j] = running
    expected = [0.0] * len(INPUT)
    for position, advantage in zip(ACTION_POSITIONS, advantages, strict=True):
        expected[position] = advantage
    assert values(datum, "advantages") == pytest.approx(expected)
    assert values(datum, "weights") == WEIGHTS
    recipe.finish_cycle(0, ctx, options=options)
    critic_train = [call for call in ctx.client.calls if call[1] == "forward_backward"]
    (critic_datum,) = critic_train[0][2]["data"]
    assert values(critic_datum, "weights") == WEIGHTS
    returns = values(critic_datum, "returns")
    for position, advantage, before in zip(ACTION_POSITIONS, advantages, value, strict=True):
        assert returns[position] == pytest.approx(advantage + before)


@pytest.mark.parametrize("loss", LOSS_FUNCTIONS)
def test_every_loss_passes_the_config_check_on_a_multi_turn_environment(loss: str) -> None:
    check_rl_config(RLConfig(env="quiz", loss=loss))
    if loss not in ("cross_entropy", "ppo_critic"):
        check_rl_config(RLConfig(env="quiz", loss=loss, reference_kl={"enabled": True}))


def scrambled(datum: dict[str, Any]) -> dict[str, Any]:
    """The datum with other logprobs and advantages at its weight-0 positions."""
    inputs = {name: dict(tensor) for name, tensor in datum["loss_inputs"].items()}
    weights = inputs["weights"]["values"]
    for name, other in (("logprobs", -3.5), ("advantages", 2.0)):
        if name in inputs:
            inputs[name]["values"] = [
                value if weight else other
                for value, weight in zip(inputs[name]["values"], weights, strict=True)
            ]
    return {**datum, "loss_inputs": inputs}


def test_observation_tokens_change_no_loss_on_the_engine(whitney_client: WhitneyClient) -> None:
    """Each policy loss on the real engine: the transcript datum's loss does not move when
    its observation positions' logprobs and advantages change; importance_sampling's equals
    the sum over the sampled tokens, by hand from the engine's per-token logprobs."""
    session = whitney_client.open_session()
    run = whitney_client.create_run(session.session_id, "local", "local/nano", seed=3)
    sample, request = transcript_call()
    for loss in [name for name in LOSS_FUNCTIONS if name not in ("cross_entropy", "ppo_critic")]:
        payload = load_recipe(loss).build_loss(sample, 0, request, context())
        first = whitney_client.run_operation(run.run_id, "forward", payload)
        other = {**payload, "data": [scrambled(datum) for datum in payload["data"]]}
        second = whitney_client.run_operation(run.run_id, "forward", other)
        assert first["loss"] == second["loss"], loss
        if loss == "importance_sampling":
            learner = first["outputs"][0]["logprobs"]
            by_hand = -sum(
                math.exp(learner[t] - LOGPROBS[t]) * ADVANTAGES[t] for t in ACTION_POSITIONS
            )
            assert first["loss"] == pytest.approx(by_hand, rel=1e-5)
    whitney_client.close_session(session.session_id)
