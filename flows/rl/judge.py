"""Judged rewards in the RL flow: a judge model on a frozen run of the same Whitney grades
the completions (flows.rl.judge_rubric asks and reads; docs/judge.md).

    open_judge_run     create_run of the judge's base model in the flow's session (never
                       trained) and publish its one sampler, named `judge`
    Judge.rewards      a cycle's judge calls: `logprobs` or `sample` on that sampler, each an
                       operation task (retried, billed, recorded in the cycle's operations
                       under `judge`), at most `concurrency` in flight, tagged whitney-judge

Seq ids and the cache: the judge run's seq ids are carried from cycle to cycle like the
policy's (`CycleStart`). Every answer goes into a cache file of the judge run (JSON lines,
keyed by judge model, call kind and canonical payload: rubric, prompt, completion tokens and
seed), so a question is asked once per judge run:

- a question answered by an earlier cycle (its seq id below this cycle's start) takes no seq
  id and is not billed again;
- every other distinct question of the cycle takes the next seq id, in the cycle's order of
  questions, whether or not it is sent, so a retried cycle gives each the same id; one
  answered by an earlier attempt of this cycle is read from the cache (not sent, recorded in
  the cycle's operations as a journal replay would be); only the rest are sent.

The cache is what keeps the ids stable across a cycle's attempts: it lives as long as the
judge run (one flow run attempt, one process), in `judge.cache_dir`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect import tags
from prefect.futures import PrefectFuture
from pydantic import BaseModel

from flows.core.environments import Completion
from flows.core.loop.training import TrainingRun
from flows.rl.judge_rubric import Question, Rubric
from tasks.operations import SAMPLER_OPERATION_TASKS, SequencedClient, task_payload
from whitney import wire
from whitney.renderers import Prompt

JUDGE_TAG = "whitney-judge"
"""The tag of every judge call's task run: `prefect concurrency-limit create whitney-judge N`
caps the judge calls in flight across every flow run on the Prefect server."""
JUDGE_SAMPLER = "judge"
ROLE_LABEL = "whitney-flows.role"


class JudgeHandle(BaseModel):
    """The judge run as the cycles see it."""

    run_id: str
    sampler_id: str
    model: str
    cache_file: str


def default_cache_dir() -> Path:
    """~/.cache/whitney-flows/judge (or under XDG_CACHE_HOME)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "whitney-flows" / "judge"


def open_judge_run(
    training: TrainingRun, model: str, cache_dir: str | None
) -> tuple[JudgeHandle, int]:
    """Create the frozen judge run of `model` in the training run's session (idempotent per
    flow run attempt) and publish its sampler once; the handle (its answers cached under
    `cache_dir`, else `default_cache_dir`) and the judge run's next seq id."""
    run = training.add_run("judge", base_model=model, trainable=False, labels={ROLE_LABEL: "judge"})
    client = training.client({run.run_id: run.next_seq_id})
    published = client.execute(run.run_id, "save_weights_for_sampler", {"name": JUDGE_SAMPLER})
    directory = Path(cache_dir) if cache_dir else default_cache_dir()
    directory.mkdir(parents=True, exist_ok=True)
    handle = JudgeHandle(
        run_id=run.run_id,
        sampler_id=published.result_as(wire.SamplerResult).sampler_id,
        model=model,
        cache_file=str(directory / f"{run.run_id}.jsonl"),
    )
    return handle, client.ledger.position(run.run_id)


class JudgeCache:
    """The judge run's answers by question key: the operation that answered each."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.answers: dict[str, wire.Operation] = {}
        if path.exists():
            for line in path.read_text(encoding="utf-8").splitlines():
                entry = json.loads(line)
                self.answers[entry["key"]] = wire.Operation.model_validate(entry["operation"])

    def get(self, key: str) -> wire.Operation | None:
        return self.answers.get(key)

    def add(self, key: str, operation: wire.Operation) -> None:
        self.answers[key] = operation
        line = json.dumps({"key": key, "operation": operation.model_dump(mode="json")})
        with self.path.open("a", encoding="utf-8") as file:
            file.write(line + "\n")


class Judge:
    """A cycle's judge: its questions asked through the cycle's client from `start`, the
    judge run's first seq id in this cycle."""

    def __init__(
        self,
        handle: JudgeHandle,
        rubric: Rubric,
        client: SequencedClient,
        concurrency: int,
    ) -> None:
        self.handle = handle
        self.rubric = rubric
        self.client = client
        self.concurrency = concurrency
        self.start = client.ledger.position(handle.run_id)
        self.cache = JudgeCache(Path(handle.cache_file))

    def rewards(self, groups: Sequence[tuple[Prompt, Sequence[Completion]]]) -> list[list[float]]:
        """Each group's rewards, in the order of its completions."""
        if self.rubric.settings.mode == "group":
            questions = [
                self.rubric.group_question(prompt, [c.text for c in completions])
                for prompt, completions in groups
            ]
            results = self.answers(questions)
            return [
                self.rubric.group_rewards(result, len(completions))
                for result, (_, completions) in zip(results, groups, strict=True)
            ]
        asked = [
            [self.rubric.item_question(prompt, completion.text) for completion in completions]
            for prompt, completions in groups
        ]
        results = iter(self.answers([question for group in asked for question in group]))
        return [
            [self.rubric.item_reward(question, next(results)) for question in group]
            for group in asked
        ]

    def answers(self, questions: Sequence[Question]) -> list[dict[str, Any]]:
        """Each question's result: from the cache, else asked (see the module docstring)."""
        keys = [question.key(self.handle.model) for question in questions]
        found: dict[str, dict[str, Any]] = {}
        pending: list[tuple[str, Question, int]] = []
        for key, question in zip(keys, questions, strict=True):
            if key in found or key in {waiting for waiting, _, _ in pending}:
                continue
            cached = self.cache.get(key)
            if cached is not None and cached.seq_id < self.start:  # an earlier cycle's
                found[key] = cached.result or {}
                continue
            seq_id = self.client.ledger.next(self.handle.run_id)
            if cached is not None and cached.seq_id == seq_id:  # an earlier attempt's
                self.client.log.record(cached)
                found[key] = cached.result or {}
                continue
            pending.append((key, question, seq_id))
        for key, operation in self.ask(pending):
            found[key] = operation.result or {}
        return [found[key] for key in keys]

    def ask(self, pending: Sequence[tuple[str, Question, int]]) -> list[tuple[str, wire.Operation]]:
        """Send the questions on their seq ids, at most `concurrency` in flight, in seq order;
        each answer is cached and recorded as soon as it is in."""
        futures: list[PrefectFuture[wire.Operation]] = []
        answered = []
        for index, (key, question, _) in enumerate(pending):
            while len(futures) < min(len(pending), index + self.concurrency):
                _, waiting, seq_id = pending[len(futures)]
                futures.append(self.submit(waiting, seq_id))
            with self.client.log.timing(question.kind):
                operation = futures[index].result()
            self.cache.add(key, operation)
            self.client.log.record(operation)
            answered.append((key, operation))
        return answered

    def submit(self, question: Question, seq_id: int) -> PrefectFuture[wire.Operation]:
        task = SAMPLER_OPERATION_TASKS[question.kind]
        with tags(JUDGE_TAG):
            return self.client.whitney.submit(
                task,
                self.handle.run_id,
                self.handle.sampler_id,
                seq_id,
                task_payload(question.payload),
            )
