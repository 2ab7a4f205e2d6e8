"""Multi-turn transcripts as tokens, and as the sequences a build_loss recipe trains on.

`next_prompt` is the one place where an environment's observation becomes tokens: the plan's
renderer renders it as messages (text is one user turn) after the transcript so far, turn by
turn (`whitney.renderers.Transcript`): the earlier prompts and the actions sampled on them
stay token for token, and each observation appends what the renderer writes after an
assistant turn (an action cut at max_tokens first gets its end-of-turn token, unlearned), the
observation's messages and the next assistant header. The raw renderer (`local/*`) writes BOS
and the text: the first prompt is BOS + the initial observation, the later ones append the
observation's tokens.

`transcript_sequences` turns an episode's turns into what a recipe reads: a prompt and a
sequence `{"tokens", "logprobs", "stop_reason", "action_mask"}` per segment. While each
turn's prompt extends the previous transcript, the whole episode is one segment: its prompt is
the first turn's, its tokens are every action and the observation tokens between them. The
`action_mask` is 1.0 on the tokens the policy sampled and 0.0 on the observation tokens,
whose `logprobs` are 0.0 placeholders. A turn whose prompt does not extend the transcript
starts a new segment (the flow's own always extend: `Transcript` refuses a renderer that would
rewrite the earlier turns). Recipes give action tokens weight 1, their
sampled logprob and the episode's advantage, and observation tokens weight 0
(`flows.rl.recipes.policy_datums`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from whitney.renderers import Prompt, Renderer, Transcript, as_messages


@dataclass(frozen=True)
class Turn:
    """One turn of an episode: the prompt it was sampled on and the action sampled."""

    prompt: tuple[int, ...]
    action: tuple[int, ...]
    logprobs: tuple[float, ...]
    stop_reason: str
    """The sampler's: `stop` (a stop token ended the action) or `length` (max tokens)."""
    seq_id: int
    """The `sample` operation that drew the action."""


def first_prompt(renderer: Renderer, observation: Prompt) -> Transcript:
    """An episode's transcript, opened on its initial observation: its tokens are the first
    turn's prompt."""
    return Transcript(renderer, as_messages(observation))


def next_prompt(transcript: Transcript, observation: Prompt) -> list[int]:
    """The next turn's prompt: `transcript` (which holds the last action: `add_completion`)
    with the observation rendered after it."""
    return list(transcript.add_messages(as_messages(observation)))


@dataclass(frozen=True)
class Segment:
    """A stretch of an episode that is one datum: its prompt and its sequence."""

    prompt: list[int]
    sequence: dict[str, Any]


def transcript_sequences(turns: Sequence[Turn]) -> list[Segment]:
    """An episode's turns as segments: one while every prompt extends the transcript before
    it, one more at each turn whose prompt does not."""
    segments: list[Segment] = []
    transcript: tuple[int, ...] = ()
    for turn in turns:
        extends = bool(segments) and turn.prompt[: len(transcript)] == transcript
        if not extends:
            segments.append(Segment(list(turn.prompt), empty_sequence()))
            observation: tuple[int, ...] = ()
        else:
            observation = turn.prompt[len(transcript) :]
        sequence = segments[-1].sequence
        sequence["tokens"] += [*observation, *turn.action]
        sequence["logprobs"] += [0.0] * len(observation) + list(turn.logprobs)
        sequence["action_mask"] += [0.0] * len(observation) + [1.0] * len(turn.action)
        sequence["stop_reason"] = turn.stop_reason
        transcript = turn.prompt + turn.action
    return segments


def empty_sequence() -> dict[str, Any]:
    return {"tokens": [], "logprobs": [], "action_mask": [], "stop_reason": "stop"}
