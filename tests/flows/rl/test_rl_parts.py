"""The RL flow's parts on their own: seq ledger, seeds, environments, recipes, advantages,
config schema, retry policy, connection and records helpers."""

from __future__ import annotations

import ast
import hashlib
import pickle
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY
from prefect.states import Completed, Failed
from pydantic import SecretStr

from blocks.connection import WhitneyConnection, client_for
from flows.core.config import ConfigError
from flows.core.environments import Completion, load_environment
from flows.core.environments.digits import DigitsEnvironment
from flows.core.environments.lowercase import LowercaseEnvironment
from flows.core.loop.plans import derive_seed
from flows.core.orchestration.heartbeat import subflows_without_heartbeat
from flows.core.records.run_records import artifact_key
from flows.rl.batch import score_group
from flows.rl.config import RLConfig
from flows.rl.plan import check_rl_config, probe
from flows.rl.recipes import join_payloads, load_recipe
from tasks.operations import SeqLedger
from tasks.retry import TaskRetrySettings, retry_if_retryable
from whitney.errors import InvalidDatum, RateLimited, TransportError
from whitney.renderers import get_renderer
from whitney.tokenizers import get_tokenizer


def test_seq_ledger_hands_out_ids_in_order_and_blocks() -> None:
    ledger = SeqLedger({"run-a": 5})
    assert ledger.next("run-a") == 5
    assert ledger.reserve("run-a", 3) == range(6, 9)
    assert ledger.next("run-a") == 9
    assert ledger.position("run-a") == 10
    with pytest.raises(KeyError, match="run-b"):
        ledger.next("run-b")
    with pytest.raises(ValueError, match="start at 1"):
        SeqLedger({"run-a": 0})


def test_seeds_are_stable_and_distinct() -> None:
    assert derive_seed(0, 1, 2) == derive_seed(0, 1, 2)
    seeds = {
        derive_seed(seed, cycle, index)
        for seed in (0, 1)
        for cycle in range(5)
        for index in range(8)
    }
    assert len(seeds) == 80
    assert all(0 <= seed < 2**31 for seed in seeds)
    expected = int.from_bytes(hashlib.sha256(b"0:3:1").digest()[:4], "big") >> 1
    assert derive_seed(0, 3, 1) == expected  # SHA-256, not hash(): the same in every process


def test_digits_rewards_numbers() -> None:
    env = DigitsEnvironment()
    assert env.reward("n=", Completion("123", stopped=True)) == 1.0
    assert env.reward("n=", Completion("12ab", stopped=False)) == 0.25
    assert env.reward("n=", Completion("", stopped=True)) == 0.0
    assert env.reward("n=", Completion("٣", stopped=True)) == 0.0  # not an ASCII digit
    assert env.prompts(0, 4, seed=9) == env.prompts(0, 4, seed=9)


def test_lowercase_rewards_lowercase_prose() -> None:
    env = LowercaseEnvironment()
    assert env.reward("Say: ", Completion("hello you", stopped=True)) == 1.0
    assert env.reward("Say: ", Completion("Hi!!", stopped=True)) == 0.25


def test_environments_load_by_name_or_import_path() -> None:
    assert isinstance(load_environment("digits"), DigitsEnvironment)
    assert isinstance(
        load_environment("flows.core.environments.lowercase:LowercaseEnvironment"),
        LowercaseEnvironment,
    )
    with pytest.raises(ValueError, match="unknown environment 'nope'"):
        load_environment("nope")
    with pytest.raises(ValueError, match="cannot import"):
        load_environment("no_such_module:Thing")
    with pytest.raises(ValueError, match="not an environment"):
        load_environment("flows.core.loop.plans:derive_seed")


def test_recipes_load_by_loss_name() -> None:
    assert load_recipe("importance_sampling").loss_function == "importance_sampling"
    with pytest.raises(ValueError, match="no build_loss recipe for loss 'nope'"):
        load_recipe("nope")


def test_join_payloads_concatenates_groups_of_one_loss() -> None:
    one = {"data": [{"a": 1}], "loss_function": "importance_sampling", "loss_config": {}}
    two = {"data": [{"b": 2}], "loss_function": "importance_sampling", "loss_config": {}}
    assert join_payloads([one, two])["data"] == [{"a": 1}, {"b": 2}]
    with pytest.raises(ValueError, match="payload 1"):
        join_payloads([one, {**two, "loss_function": "ppo"}])


@pytest.mark.parametrize(
    ("estimator", "advantages"),
    [
        ("grpo_no_std", [0.5, -0.5, 0.5, -0.5]),
        ("grpo", [1.0, -1.0, 1.0, -1.0]),
        ("rloo", [2 / 3, -2 / 3, 2 / 3, -2 / 3]),
    ],
)
def test_group_scores(estimator: str, advantages: list[float]) -> None:
    tokenizer = get_tokenizer("local/tiny")
    sample = {
        "sequences": [
            {"tokens": [*b"12", tokenizer.eos_id], "logprobs": [0, 0, 0], "stop_reason": "stop"},
            {"tokens": [*b"ab"], "logprobs": [0, 0], "stop_reason": "length"},
        ]
        * 2
    }
    renderer = get_renderer("raw", tokenizer, "local/tiny")
    score = score_group(DigitsEnvironment(), renderer, "n=", sample, estimator)
    assert score.rewards == [1.0, 0.0, 1.0, 0.0]
    assert score.advantages == pytest.approx(advantages)
    assert not score.uniform


def test_probe_builds_the_recipe_payload_without_whitney() -> None:
    config = RLConfig(provider="tinker")
    payload, _ = probe(check_rl_config(config))
    assert payload["loss_function"] == "importance_sampling"
    assert len(payload["data"]) == 2


def test_check_names_the_field() -> None:
    with pytest.raises(ConfigError) as error:
        check_rl_config(RLConfig(provider="modal", loss="dro"))
    assert error.value.field == "loss"
    with pytest.raises(ConfigError) as error:
        check_rl_config(RLConfig(base_model="gpt-nothing"))
    assert error.value.field == "base_model"


def test_config_schema_is_a_documented_form() -> None:
    schema = RLConfig.model_json_schema()
    properties = schema["properties"]
    assert "api_key" not in properties
    assert all(field.get("description") for field in properties.values())
    assert properties["cycles"]["minimum"] == 1
    assert properties["group_size"]["minimum"] == 2
    assert set(properties["advantages"]["enum"]) == {"grpo", "grpo_no_std", "rloo"}
    assert "importance_sampling" in properties["loss"]["enum"]


def test_retry_policy_retries_only_retryable_whitney_errors() -> None:
    def verdict(error: Exception) -> bool:
        return retry_if_retryable(None, None, Failed(data=error))

    assert verdict(TransportError("connection dropped"))
    assert verdict(RateLimited("slow down", status=429))
    assert not verdict(InvalidDatum("data[0].loss_inputs.weights", status=422))
    assert not verdict(RuntimeError("a bug"))
    assert not retry_if_retryable(None, None, Completed())


def test_retry_delays_back_off_exponentially_with_a_cap() -> None:
    settings = TaskRetrySettings(retries=5, delay_s=0.5, max_delay_s=3.0, jitter=0.3)
    assert settings.delays() == [0.5, 1.0, 2.0, 3.0, 3.0]
    options = settings.task_options()
    assert options["retries"] == 5 and options["retry_jitter_factor"] == 0.3


def test_connection_hides_the_key_and_shares_one_client() -> None:
    connection = WhitneyConnection(base_url="http://127.0.0.1:9", api_key=SecretStr("k-123"))
    assert "k-123" not in repr(connection)
    assert "k-123" not in connection.model_dump_json()
    same = pickle.loads(pickle.dumps(connection))
    assert same == connection
    assert client_for(same) is client_for(connection)
    assert "k-123" not in repr(client_for(connection))


def test_artifact_keys_are_lowercase_digits_and_dashes() -> None:
    assert artifact_key("rl", "Quizzical_Coucal 7", "progress") == "rl-quizzical-coucal-7-progress"


def test_subflows_run_without_their_heartbeat_thread() -> None:
    before = PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value()
    with subflows_without_heartbeat():
        assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() is None
    assert PREFECT_FLOWS_HEARTBEAT_FREQUENCY.value() == before


def test_metrics_usage_fallback() -> None:
    from tasks.operations import OperationLog

    log = OperationLog()
    log.record(SimpleNamespace(kind="sample", usage={"tokens": 9, "sampled_tokens": 7}))
    log.record(SimpleNamespace(kind="forward_backward", usage={"tokens": 5}))
    assert log.tokens("sample", "sampled_tokens") == 7
    assert log.tokens("forward_backward", "trained_tokens") == 5
    assert log.tokens("optim_step") == 0


def imported_packages(package: str) -> set[str]:
    """Top-level packages the modules of `package` import (from their source)."""
    root = Path(__file__).resolve().parents[3] / package
    names = set()
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def test_layering_flows_over_tasks_over_whitney() -> None:
    assert not imported_packages("tasks") & {"flows"}
    assert "flows" not in imported_packages("whitney")
    light = (
        "import sys, flows, tasks, flows.cli.main\n"
        "assert not [m for m in sys.modules if m.split('.')[0] in ('prefect', 'torch')]\n"
    )
    assert subprocess.run([sys.executable, "-c", light], timeout=60).returncode == 0
