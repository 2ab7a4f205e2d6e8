"""Our configs for tinker-cookbook's own training code (unmodified): its supervised loop
(`tinker_cookbook.supervised.train`) on a local JSONL of chats, and its RL loop
(`tinker_cookbook.rl.train`) on a local task, both on SmolLM2-135M-Instruct with the
`role_colon` renderer (the cookbook's model table does not know SmolLM2; no hub dataset)."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

import chz
from tinker_cookbook import renderers
from tinker_cookbook.rl import train as rl_train
from tinker_cookbook.rl.problem_env import ProblemEnv, ProblemGroupBuilder
from tinker_cookbook.rl.types import EnvGroupBuilder, RLDataset, RLDatasetBuilder
from tinker_cookbook.supervised import train as sl_train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
from tinker_cookbook.tokenizer_utils import get_tokenizer

from tests.hfmodels.real_model import REPO_ID

MODEL = REPO_ID
"""SmolLM2-135M-Instruct as `whitney-flows models pull smollm2-135m-instruct` imports it."""
RENDERER = "role_colon"
TARGET = "blue"


def write_chats(path: Path, count: int = 64) -> Path:
    """`count` one-turn chats (a sum and its answer) as the cookbook's JSONL."""
    rng = random.Random(0)
    with path.open("w") as out:
        for _ in range(count):
            a, b = rng.randint(1, 20), rng.randint(1, 20)
            chat = [
                {"role": "user", "content": f"What is {a} plus {b}?"},
                {"role": "assistant", "content": f"{a} plus {b} is {a + b}."},
            ]
            out.write(json.dumps({"messages": chat}) + "\n")
    return path


def sl_config(base_url: str, log_path: Path, data: Path, steps: int) -> sl_train.Config:
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=MODEL, renderer_name=RENDERER, max_length=64, batch_size=4
    )
    return sl_train.Config(
        log_path=str(log_path),
        model_name=MODEL,
        recipe_name="whitney_sl",
        renderer_name=RENDERER,
        dataset_builder=FromConversationFileBuilder(file_path=str(data), common_config=common),
        learning_rate=1e-3,
        lora_rank=8,
        base_url=base_url,
        save_every=0,
        eval_every=0,
        infrequent_eval_every=0,
        max_steps=steps,
    )


class ColorEnv(ProblemEnv):
    """Name a color: reward 1 when the answer says `TARGET`."""

    def get_question(self) -> str:
        return "Name one color. Answer with one word."

    def check_answer(self, sample_str: str) -> bool:
        return TARGET in sample_str.lower()

    def check_format(self, sample_str: str) -> bool:
        return sample_str.strip() != ""

    def get_reference_answer(self) -> str:
        return TARGET


class ColorDataset(RLDataset):
    def __init__(self, renderer: renderers.Renderer, batches: int, groups: int, size: int):
        self.renderer, self.batches, self.groups, self.size = renderer, batches, groups, size

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        return [
            ProblemGroupBuilder(lambda: ColorEnv(self.renderer), self.size, "color")
            for _ in range(self.groups)
        ]

    def __len__(self) -> int:
        return self.batches


@chz.chz
class ColorDatasetBuilder(RLDatasetBuilder):
    batches: int
    groups: int = 2
    group_size: int = 4

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        renderer = renderers.get_renderer(RENDERER, get_tokenizer(MODEL))
        return ColorDataset(renderer, self.batches, self.groups, self.group_size), None


def rl_config(base_url: str, log_path: Path, steps: int) -> rl_train.Config:
    return rl_train.Config(
        learning_rate=2e-3,
        dataset_builder=ColorDatasetBuilder(batches=steps),
        model_name=MODEL,
        recipe_name="whitney_rl",
        renderer_name=RENDERER,
        max_tokens=8,
        log_path=str(log_path),
        eval_every=0,
        save_every=0,
        lora_rank=8,
        base_url=base_url,
        max_steps=steps,
    )


def metrics(log_path: Path) -> list[dict[str, float]]:
    """The cookbook's per-step metrics (`metrics.jsonl`)."""
    return [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines()]
