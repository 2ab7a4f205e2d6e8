"""The RL flow's judge settings (`RLConfig.judge`): which model grades the completions, the
rubric it is asked, and how its answer becomes a reward (no Prefect: the UI form and the CLI
read it). docs/judge.md."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from flows.core.fields import NonEmpty, Settings
from whitney.renderers import RendererName

JudgeMode = Literal["logprobs", "verdict", "group"]

ITEM_TEMPLATE = "{rubric}\n\nRequest: {prompt}\nReply: {completion}\n\nAnswer {choices}:"
"""The judge's question about one completion (modes logprobs and verdict)."""
GROUP_TEMPLATE = (
    "{rubric}\n\nRequest: {prompt}\n\n{completions}\n\nScore every reply from 0 to {scale}, "
    "one line each, as `number: score`:"
)
"""The judge's question about a group of completions of one prompt (mode group)."""


class JudgeSettings(Settings):
    """A judge model on a frozen run of the same Whitney, asked a rubric question about each
    completion (or each group): its answer is the reward instead of the environment's."""

    model: NonEmpty | None = Field(
        default=None,
        description="The judge's base model: any name the provider's capabilities list (it "
        "may differ from base_model); empty: no judge, the environment rewards",
    )
    tokenizer: NonEmpty | None = Field(
        default=None, description="The judge's tokenizer; empty: its model's own"
    )
    renderer: RendererName = Field(
        default="auto", description="How the judge's question becomes tokens (as `renderer`)"
    )
    mode: JudgeMode = Field(
        default="logprobs",
        description="logprobs: the reward is the expected value of `choices` under the "
        "judge's probabilities of their tokens after the question (one logprobs call per "
        "completion); verdict: the judge samples an answer, whose first choice label gives "
        "the reward; group: RULER-style, the judge scores a prompt's whole group in one "
        "sampled answer (reward = score / scale)",
    )
    rubric: NonEmpty = Field(
        default="Is the reply a good answer to the request?",
        max_length=4000,
        description="The rubric question the judge is asked",
    )
    template: NonEmpty | None = Field(
        default=None,
        max_length=8000,
        description="The judge's prompt, with {rubric}, {prompt}, {completion} and {choices} "
        "(group: {rubric}, {prompt}, {completions}, {scale}); empty: the built-in one",
    )
    choices: dict[str, float] = Field(
        default_factory=lambda: {"Yes": 1.0, "No": 0.0},
        description="logprobs and verdict: the answers the judge may give and the reward of "
        "each (e.g. {Yes = 1.0, No = 0.0}, or 1 to 5 as labels)",
    )
    scale: int = Field(
        default=10, ge=1, le=1000, description="group: the highest score the judge may give"
    )
    max_tokens: int = Field(
        default=16, ge=1, le=4096, description="verdict and group: most tokens of the answer"
    )
    temperature: float = Field(
        default=0.0,
        ge=0,
        le=10,
        description="verdict and group: the judge's sampling temperature (0: greedy); "
        "seeded from the seed and the question, so the same question gets the same answer",
    )
    unparsed_reward: float = Field(
        default=0.0,
        ge=-1e6,
        le=1e6,
        description="verdict and group: the reward of a completion whose grade the judge's "
        "answer does not give",
    )
    concurrency: int = Field(
        default=4,
        ge=1,
        le=256,
        description="Most judge calls of a cycle in flight at once (the flow's own limit; "
        "their task runs are tagged whitney-judge for a Prefect tag concurrency limit too)",
    )
    cache_dir: NonEmpty | None = Field(
        default=None,
        description="Where the judge's answers are kept, one file per judge run, so a "
        "retried cycle asks nothing twice; empty: ~/.cache/whitney-flows/judge",
    )

    @field_validator("choices")
    @classmethod
    def _choices_are_labels(cls, value: dict[str, float]) -> dict[str, float]:
        if len(value) < 2:
            raise ValueError("give at least two answers, e.g. {Yes = 1.0, No = 0.0}")
        if any(not label.strip() for label in value):
            raise ValueError("an answer label is empty")
        return value

    @field_validator("template")
    @classmethod
    def _template_has_its_fields(cls, value: str | None, info: ValidationInfo) -> str | None:
        mode = info.data.get("mode", "logprobs")
        needed = ("{prompt}", "{completions}" if mode == "group" else "{completion}")
        for field in needed if value is not None else ():
            if field not in value:
                raise ValueError(f"a {mode} template needs {field}")
        return value

    @property
    def enabled(self) -> bool:
        """A judge model is set: the judge rewards the completions."""
        return self.model is not None

    @property
    def question(self) -> str:
        """The template in use (the setting, else the mode's built-in one)."""
        if self.template is not None:
            return self.template
        return GROUP_TEMPLATE if self.mode == "group" else ITEM_TEMPLATE
