"""Train on Tinker without an account: a broker (`serve --tinker-url`) forwards its provider
`tinker` runs through the official SDK to a second served process, the Tinker front, whose
engine trains them. The chain gives the bits and the adapter of the same run emulated on the
CPU engine (provider `tinker` on a server without `--tinker-url`); both are real processes on
loopback."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.local.served import ServedWhitney, served
from tests.tinker.proxy import DroppingProxy, dropping_proxy
from tests.tinker.steps import (
    ADAM,
    BASE_MODEL,
    KEYS,
    PROMPT,
    RANK,
    SEED,
    adapter_sha256,
    assert_same,
    sdk_key,
    sl_rows,
    through_whitney,
    whitney_datum,
)
from whitney import WhitneyClient
from whitney.errors import WhitneyError
from whitney.tokenizers import get_tokenizer


@contextmanager
def tinker_key(key: str) -> Iterator[None]:
    """TINKER_API_KEY in this process's environment (which the served broker inherits)."""
    before = os.environ.get("TINKER_API_KEY")
    os.environ["TINKER_API_KEY"] = key
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TINKER_API_KEY", None)
        else:
            os.environ["TINKER_API_KEY"] = before


@pytest.fixture(scope="module")
def broker(
    server: ServedWhitney, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServedWhitney]:
    """A served broker whose provider `tinker` runs go to `server` (the front) as tenant A."""
    tmp = tmp_path_factory.mktemp("tinker-broker")
    with tinker_key(sdk_key(0)), served(tmp, "--tinker-url", server.url, keys=KEYS) as process:
        yield process


def front_runs(server: ServedWhitney) -> list[dict]:
    """The runs in the front's journal (read from its data directory)."""
    data_dir = Path(server.argv[server.argv.index("--data-dir") + 1])
    with sqlite3.connect(data_dir / "journal.sqlite3") as conn:
        conn.row_factory = sqlite3.Row
        return [dict(row) for row in conn.execute("SELECT * FROM runs ORDER BY created_at")]


def test_a_forwarded_run_gives_the_cpu_engines_bits_and_adapter(
    server: ServedWhitney, broker: ServedWhitney
) -> None:
    before = {run["run_id"] for run in front_runs(server)}
    forwarded = through_whitney(broker.url, KEYS[0])
    emulated = through_whitney(server.url, KEYS[0])  # provider tinker on the CPU engine
    assert_same(forwarded, emulated)
    assert forwarded.losses[-1] < forwarded.losses[0]
    assert adapter_sha256(broker.url, KEYS[0], forwarded.run_id) == adapter_sha256(
        server.url, KEYS[0], emulated.run_id
    )
    # the broker's run says where it trained; the front holds the Tinker model that trained it
    with WhitneyClient(broker.url, KEYS[0]) as client:
        run = client.get_run(forwarded.run_id)
    assert run.model_extra["trained_at"] == server.url
    assert run.step == 3
    models = [run for run in front_runs(server) if run["run_id"] not in before]
    tinker_models = [m for m in models if m["run_id"] != emulated.run_id]
    assert len(tinker_models) == 1
    model = tinker_models[0]
    assert (model["provider"], model["base_model"], model["lora_rank"]) == (
        "tinker",
        BASE_MODEL,
        RANK,
    )
    assert model["step"] == 3


def checkpoints(base_url: str) -> tuple[list[float], str]:
    """A step, save_state, two steps, load_state (with the optimizer), a step again, then a
    new run from the checkpoint and a step: the losses, and the new run's adapter sha256."""
    payload = {"data": [whitney_datum(row) for row in sl_rows()], "loss_function": "cross_entropy"}
    losses: list[float] = []
    with WhitneyClient(base_url, KEYS[0]) as client:
        session = client.open_session().session_id
        run = client.create_run(session, "tinker", BASE_MODEL, lora_rank=RANK, seed=SEED).run_id

        def step(run_id: str) -> None:
            losses.append(client.run_operation(run_id, "forward_backward", payload)["loss"])
            client.run_operation(run_id, "optim_step", {"optimizer": ADAM})

        step(run)
        saved = client.run_operation(run, "save_state", {"name": "after-one"})["checkpoint"]
        step(run)
        step(run)
        loaded = client.run_operation(run, "load_state", {"checkpoint": saved})
        assert loaded["step"] == 1
        step(run)
        resumed = client.create_run(
            session, "tinker", BASE_MODEL, lora_rank=RANK, seed=SEED, from_checkpoint=saved
        ).run_id
        assert client.get_run(resumed).step == 1
        step(resumed)
        sha256 = client.run_operation(resumed, "export_lora", {})["sha256"]
    return losses, sha256


def test_checkpoints_of_a_forwarded_run_are_the_cpu_engines(
    server: ServedWhitney, broker: ServedWhitney
) -> None:
    forwarded, emulated = checkpoints(broker.url), checkpoints(server.url)
    assert forwarded == emulated  # the losses and the resumed run's adapter
    losses = forwarded[0]
    assert losses[3] == losses[1] == losses[4]  # back at the saved state, twice
    assert losses[2] < losses[1]


def test_finishing_a_forwarded_run_ends_its_tinker_session(
    server: ServedWhitney, broker: ServedWhitney
) -> None:
    with WhitneyClient(broker.url, KEYS[0]) as client:
        session = client.open_session()
        run_id = client.create_run(session.session_id, "tinker", BASE_MODEL, lora_rank=RANK).run_id
        client.run_operation(run_id, "save_weights_for_sampler", {})
        before = {run["run_id"]: run for run in front_runs(server)}
        active = [r for r in before.values() if r["status"] == "ready"]
        assert client.cancel(run_id).status == "cancelled"
    after = {run["run_id"]: run for run in front_runs(server)}
    ended = [rid for rid in (r["run_id"] for r in active) if after[rid]["status"] != "ready"]
    assert ended, "cancelling the forwarded run left its Tinker model loaded"


def test_a_forwarded_run_never_falls_back_to_the_cpu(tmp_path: Path) -> None:
    """An endpoint that is down: the run's creation fails in one line naming it."""
    with (
        tinker_key(sdk_key(0)),
        served(tmp_path, "--tinker-url", "http://127.0.0.1:9", keys=KEYS) as broker,
    ):
        with WhitneyClient(broker.url, KEYS[0]) as client:
            session = client.open_session()
            with pytest.raises(Exception) as caught:
                client.create_run(session.session_id, "tinker", BASE_MODEL, lora_rank=RANK)
            message = str(caught.value)
            assert "http://127.0.0.1:9" in message and "CPU" in message
            assert "\n" not in message and sdk_key(0) not in message
            assert client.get_session(session.session_id).run_ids == []
        log = broker.log.read_text()
    assert sdk_key(0) not in log
    assert sdk_key(0) not in json.dumps(broker.argv)  # the key is in the environment only


def ppo_forward(base_url: str) -> dict:
    """A `ppo` forward with a per-token clip range (the `tinker` provider's form)."""
    data = []
    for row in sl_rows():
        n = len(row["input"])
        row = {**row, "logprobs": [-1.5] * n, "advantages": [0.5] * n}
        row |= {"clip_low_threshold": [0.9] * n, "clip_high_threshold": [1.1] * n}
        data.append(whitney_datum(row))
    with WhitneyClient(base_url, KEYS[0]) as client:
        session = client.open_session().session_id
        run = client.create_run(session, "tinker", BASE_MODEL, lora_rank=RANK, seed=9).run_id
        return client.run_operation(run, "forward", {"data": data, "loss_function": "ppo"})


def test_a_per_token_clip_range_is_forwarded_as_tinkers_scalar(
    server: ServedWhitney, broker: ServedWhitney
) -> None:
    forwarded, emulated = ppo_forward(broker.url), ppo_forward(server.url)
    assert forwarded["metrics"]["loss:sum"] == emulated["metrics"]["loss:sum"]
    assert [o["logprobs"] for o in forwarded["outputs"]] == [
        o["logprobs"] for o in emulated["outputs"]
    ]


SAMPLE_REQUEST = {
    "prompt": {"token_ids": [5, 9, 12]},
    "num_samples": 2,
    "sampling_params": {"max_tokens": 4, "seed": 5},
}


def train(client: WhitneyClient, run: str, steps: int) -> None:
    payload = {"data": [whitney_datum(row) for row in sl_rows()], "loss_function": "cross_entropy"}
    for _ in range(steps):
        client.run_operation(run, "forward_backward", payload)
        client.run_operation(run, "optim_step", {"optimizer": ADAM})


def published_run(client: WhitneyClient) -> str:
    """A new provider `tinker` run trained one step, sampler `one` published: its id."""
    session = client.open_session().session_id
    run_id = client.create_run(session, "tinker", BASE_MODEL, lora_rank=RANK, seed=SEED).run_id
    train(client, run_id, 1)
    client.run_operation(run_id, "save_weights_for_sampler", {"name": "one"})
    return run_id


def front_operations(front: ServedWhitney, run_id: str) -> list[tuple[str, int]]:
    """(kind, executions) of each operation the front journaled for `run_id`."""
    data_dir = Path(front.argv[front.argv.index("--data-dir") + 1])
    with sqlite3.connect(data_dir / "journal.sqlite3") as conn:
        return conn.execute(
            "SELECT kind, executions FROM operations WHERE run_id=? ORDER BY seq_id", (run_id,)
        ).fetchall()


@contextmanager
def held_chain(
    front: ServedWhitney, tmp_path: Path
) -> Iterator[tuple[DroppingProxy, ServedWhitney]]:
    """A broker forwarding to `front` through a loopback proxy that can hold the front's
    answers (`hold`, then `lose_held` once the broker is killed): (proxy, broker)."""
    (tmp_path / "broker").mkdir()
    with (
        dropping_proxy(front.url) as proxy,
        tinker_key(sdk_key(0)),
        served(tmp_path / "broker", "--tinker-url", proxy.url, keys=KEYS) as broker,
    ):
        yield proxy, broker


def kill_once_the_front_has_it(
    front: ServedWhitney,
    proxy: DroppingProxy,
    broker: ServedWhitney,
    model_id: str,
    send: Callable[[], None],
) -> list[tuple[str, int]]:
    """`send` (the broker's client) in a thread, its Tinker request held at the proxy; the broker
    SIGKILLed once the front journaled one more operation of `model_id` (acted on it, its answer
    not out), then the held answers lost: the front's operations of `model_id` at the kill."""
    seen = len(front_operations(front, model_id))
    proxy.hold()
    threading.Thread(target=send, daemon=True).start()
    deadline = time.monotonic() + 60
    while len(front_operations(front, model_id)) <= seen and time.monotonic() < deadline:
        time.sleep(0.02)
    broker.kill()
    proxy.lose_held()
    return front_operations(front, model_id)


def new_front_model(front: ServedWhitney, before: set[str]) -> str:
    """The one run at the front that is not in `before`: the Tinker model of a broker's run."""
    (model,) = [run["run_id"] for run in front_runs(front) if run["run_id"] not in before]
    return model


def test_a_broker_killed_mid_operation_sends_nothing_twice(
    server: ServedWhitney, tmp_path: Path
) -> None:
    """SIGKILL while a forward_backward waits on Tinker (the front acted on it, its answer held
    on the wire), then restart: the run reconnects to its Tinker model, sends the operation
    again under its recorded Tinker seq_id, which the front answers from its record; each of the
    front's operations ran once and the adapter is the CPU engine's. The other operations'
    kills: tests/tinker/test_provider_kills.py."""
    payload = {"data": [whitney_datum(row) for row in sl_rows()], "loss_function": "cross_entropy"}
    before = {run["run_id"] for run in front_runs(server)}
    with held_chain(server, tmp_path) as (proxy, broker):
        with WhitneyClient(broker.url, KEYS[0]) as client:
            run_id = published_run(client)
        model_id = new_front_model(server, before)

        def send() -> None:  # its answer is lost with the broker; read again below
            with contextlib.suppress(Exception), WhitneyClient(broker.url, KEYS[0]) as client:
                client.run_operation(run_id, "forward_backward", payload)

        killed = kill_once_the_front_has_it(server, proxy, broker, model_id, send)
        assert [kind for kind, _ in killed][3:] == ["forward_backward"]
        broker.restart()
        with WhitneyClient(broker.url, KEYS[0]) as client:
            resent = client.get_operation(run_id, 4, wait_s=60)
            assert (resent.kind, resent.status) == ("forward_backward", "succeeded")
            client.run_operation(run_id, "optim_step", {"optimizer": ADAM})
            sampled = client.sampler_operation(run_id, "one", "sample", SAMPLE_REQUEST)
            forwarded = client.run_operation(run_id, "export_lora", {})["sha256"]
        with WhitneyClient(server.url, KEYS[0]) as client:
            emulated = published_run(client)
            train(client, emulated, 1)
            assert sampled == client.sampler_operation(
                emulated, "one", "sample", SAMPLE_REQUEST
            )  # the sampler published before the kill, sampled after it
            assert forwarded == client.run_operation(emulated, "export_lora", {})["sha256"]
        kinds = front_operations(server, model_id)
    assert [kind for kind, _ in kinds] == [
        "forward_backward",
        "optim_step",
        "save_weights_for_sampler",
        "forward_backward",
        "optim_step",
        "sample",
        "export_lora",
    ]
    assert all(executions == 1 for _, executions in kinds)
    assert sdk_key(0) not in broker.log.read_text()


def test_a_bad_tinker_url_stops_serve_in_one_line(tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "whitney.local", "serve", "--port", "0"]
    argv += ["--data-dir", str(tmp_path / "data"), "--tinker-url", "ftp://tinker.example"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "whitney-flows serve: --tinker-url: expected an http(s) URL, got 'ftp://tinker.example'"
    ]


def stopped_samples(base_url: str, stop: list[str]) -> tuple[list[dict], list[dict]]:
    """A fresh run's sampler sampled twice with the same seed, 12 tokens: without and with the
    stop strings `stop`; the sequences of each."""
    request = {
        "prompt": {"token_ids": PROMPT},
        "num_samples": 2,
        "sampling_params": {"max_tokens": 12, "seed": 11, "temperature": 1.0},
    }
    with WhitneyClient(base_url, KEYS[0]) as client:
        session = client.open_session().session_id
        run = client.create_run(session, "tinker", BASE_MODEL, lora_rank=RANK, seed=SEED).run_id
        sampler = client.run_operation(run, "save_weights_for_sampler", {})["sampler_id"]
        free = client.sampler_operation(run, sampler, "sample", request)["sequences"]
        request["sampling_params"] |= {"stop": stop}
        stopped = client.sampler_operation(run, sampler, "sample", request)["sequences"]
    return free, stopped


def test_stop_strings_end_a_forwarded_sample_where_the_cpu_engine_ends_it(
    server: ServedWhitney, broker: ServedWhitney
) -> None:
    decode = get_tokenizer(BASE_MODEL).decode
    free, _ = stopped_samples(server.url, [])
    # a stop string the first sample completes at its fourth token (and not before)
    first = free[0]["tokens"]
    stop = decode(first[:4])[len(decode(first[:3])) :] or decode(first[:4])
    forwarded_free, forwarded = stopped_samples(broker.url, [stop])
    emulated_free, emulated = stopped_samples(server.url, [stop])
    assert forwarded_free == emulated_free == free
    assert forwarded == emulated
    for unstopped, sequence in zip(free, forwarded, strict=True):
        tokens = unstopped["tokens"]
        end = next(
            (n for n in range(1, len(tokens) + 1) if stop in decode(tokens[:n])), len(tokens)
        )
        assert sequence["tokens"] == tokens[:end]  # the stopping token kept, none drawn after
        assert sequence["stop_reason"] == ("stop" if stop in decode(tokens[:end]) else "length")
    assert forwarded[0]["stop_reason"] == "stop" and len(forwarded[0]["tokens"]) <= 4


def test_stop_strings_and_stop_token_ids_together_are_refused_naming_the_field(
    broker: ServedWhitney,
) -> None:
    request = {
        "prompt": {"token_ids": PROMPT},
        "num_samples": 1,
        "sampling_params": {"max_tokens": 4, "stop": ["x"], "stop_token_ids": [7]},
    }
    with WhitneyClient(broker.url, KEYS[0]) as client:
        session = client.open_session().session_id
        run = client.create_run(session, "tinker", BASE_MODEL, lora_rank=RANK, seed=SEED).run_id
        sampler = client.run_operation(run, "save_weights_for_sampler", {})["sampler_id"]
        with pytest.raises(WhitneyError) as refused:
            client.sampler_operation(run, sampler, "sample", request)
    assert "sampling_params" in str(refused.value)
    assert "stop_token_ids" in str(refused.value)
