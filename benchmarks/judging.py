"""A judge and policies outside any flow, for the judge benchmarks: frozen runs on one Whitney
server, their replies to prompts, and a judge's rewards of replies (the flow's own questions and
arithmetic: flows.rl.judge_rubric.Rubric), with plain WhitneyClient calls.

    judge = Frozen.open(client, session_id, "gguf/SmolLM2-135M-Instruct-Q4_1")
    rewards = judge.judged(rubric, prompt, ["8", "The answer is 8."])
"""

from __future__ import annotations

from dataclasses import dataclass

from flows.rl.judge_rubric import Rubric
from whitney import wire
from whitney.client import WhitneyClient
from whitney.payloads import sample_request
from whitney.renderers import Prompt, Renderer, as_messages


@dataclass(frozen=True)
class Frozen:
    """A run whose weights never change, and the sampler of those weights."""

    client: WhitneyClient
    run_id: str
    sampler_id: str

    @classmethod
    def open(
        cls,
        client: WhitneyClient,
        session_id: str,
        model: str,
        checkpoint: str | None = None,
        lora_rank: int = 8,
    ) -> Frozen:
        """A run of `model` (its base weights, or the adapter of `checkpoint`, of `lora_rank`)
        and its sampler."""
        run = client.create_run(
            session_id,
            "local",
            model,
            lora_rank=lora_rank,
            trainable=checkpoint is not None,
            from_checkpoint=checkpoint,
        )
        published = client.execute(run.run_id, "save_weights_for_sampler", {"name": "weights"})
        return cls(client, run.run_id, published.result_as(wire.SamplerResult).sampler_id)

    def replies(
        self, renderer: Renderer, prompt: Prompt, count: int, max_tokens: int, **sampling: float
    ) -> list[str]:
        """`count` replies to `prompt` as text (`sampling`: temperature, top_k, seed)."""
        tokens = renderer.build_generation_prompt(as_messages(prompt))
        payload = sample_request(
            tokens,
            count,
            max_tokens=max_tokens,
            stop_token_ids=list(renderer.stop_tokens),
            **sampling,
        )
        result = self.client.sampler_operation(self.run_id, self.sampler_id, "sample", payload)
        return [
            renderer.parse_response(sequence["tokens"])["content"]
            for sequence in result["sequences"]
        ]

    def judged(self, rubric: Rubric, prompt: Prompt, replies: list[str]) -> list[float]:
        """The judge's reward of each reply to `prompt` (mode logprobs: one call for all)."""
        questions = [rubric.item_question(prompt, reply) for reply in replies]
        sequences = [sequence for q in questions for sequence in q.payload["sequences"]]
        result = self.client.sampler_operation(
            self.run_id, self.sampler_id, "logprobs", {"sequences": sequences}
        )
        rows = iter(result["logprobs"])
        return [
            rubric.item_reward(
                question, {"logprobs": [next(rows) for _ in question.payload["sequences"]]}
            )
            for question in questions
        ]
