"""A multi-turn episode as one token sequence, rendered turn by turn.

    transcript = Transcript(renderer, first_messages)      # tokens: the first prompt
    sample from transcript.tokens, stop at renderer.stop_tokens
    reply = transcript.add_completion(tokens, logprobs)    # the assistant message, parsed
    transcript.add_messages(environment_messages)          # tokens: the next prompt
    ...
    transcript.datum(advantage)                            # one importance_sampling datum

Sampled tokens are kept as they were sampled (learned, with their logprobs); each later turn
appends what the renderer writes after the assistant turn (its separator, the new messages, the
next assistant header), never re-tokenizing what the model produced. So every prompt is the
transcript so far, and the datum trains exactly the tokens the model sampled."""

from __future__ import annotations

from whitney.datums import Datum, tensor
from whitney.renderers.base import Message, Renderer


class Transcript:
    """Tokens, learned mask and sampling logprobs of one episode; `messages` as parsed."""

    def __init__(self, renderer: Renderer, messages: list[Message]) -> None:
        self.renderer = renderer
        self.messages: list[Message] = list(messages)
        self.tokens: list[int] = renderer.build_generation_prompt(self.messages)
        self.mask: list[float] = [0.0] * len(self.tokens)
        self.logprobs: list[float] = [0.0] * len(self.tokens)
        self._closed = True

    def add_completion(self, tokens: list[int], logprobs: list[float]) -> Message:
        """Append an assistant turn as sampled; the message it parses to."""
        if len(tokens) != len(logprobs):
            raise ValueError("a completion needs one logprob per token")
        reply = self.renderer.parse_response(tokens)
        self.messages.append(reply)
        self.tokens += tokens
        self.mask += [1.0] * len(tokens)
        self.logprobs += list(logprobs)
        self._closed = bool(tokens) and tokens[-1] in self.renderer.stop_tokens
        return reply

    def add_messages(self, messages: list[Message]) -> list[int]:
        """Append the environment's messages and the next assistant header; the new prompt.
        A completion cut at max_tokens is closed with its end-of-turn token first (unlearned)."""
        if not self.messages or self.messages[-1]["role"] != "assistant":
            raise ValueError("add_messages follows an assistant turn (add_completion)")
        before = self.renderer.build_supervised(self.messages)
        end = max(index for index, weight in enumerate(before.weights) if weight > 0) + 1
        self.messages += messages
        after = self.renderer.build_generation_prompt(self.messages)
        if after[:end] != before.tokens[:end]:
            raise ValueError(
                f"renderer {self.renderer.name} renders the earlier turns differently once "
                "the conversation goes on: it cannot render a transcript turn by turn"
            )
        new = ([] if self._closed else [before.tokens[end - 1]]) + after[end:]
        self.tokens += new
        self.mask += [0.0] * len(new)
        self.logprobs += [0.0] * len(new)
        self._closed = True
        return self.tokens

    def datum(self, advantage: float | list[float]) -> Datum:
        """The importance_sampling datum of the episode (right-shifted, as `rl_datum`): the
        sampled tokens learned with `advantage` (one value, or one per token of the whole
        transcript), everything else weighted 0."""
        n = len(self.tokens)
        per_token = [float(advantage)] * n if isinstance(advantage, int | float) else advantage
        if len(per_token) != n:
            raise ValueError(f"advantage needs {n} values, one per transcript token")
        advantages = [value * weight for value, weight in zip(per_token, self.mask, strict=True)]
        return {
            "input": {"token_ids": self.tokens[:-1]},
            "loss_inputs": {
                "target_tokens": tensor("int64", self.tokens[1:]),
                "weights": tensor("float32", self.mask[1:]),
                "logprobs": tensor("float32", self.logprobs[1:]),
                "advantages": tensor("float32", advantages[1:]),
            },
        }
