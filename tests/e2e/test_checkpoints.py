"""From a training run to an approved model, on the real Prefect server, worker and Whitney
server of the e2e stack (tests/e2e/conftest.py):

- an RL deployment run with `checkpoint_every` 1 and `eval_every` 1 saves two checkpoints;
  evaluate-checkpoint's trigger starts a run for each, and the latest comparison artifact
  lists them with the numbers of the training run's own `whitney.cycle.completed` events;
  its summary's learning curves show in the UI (headless Chromium: the picture decodes in the
  page, and a screenshot is saved);
- a promote-checkpoint run pauses with nothing open on Whitney; the test submits the approval
  through the call the UI's Resume form makes; the run exports, and the merged model and the
  adapter load with transformers offline (in a child process): the merged model greedily
  writes what the evaluation sampled with `top_k: 1`, and the adapter is the training run's
  (sha256);
- with the stall automations installed by docs/evaluation.md's command, a run whose Whitney answers
  stop coming (a proxy in front of the server holds them) is cancelled by the automation of
  its window, and the cleanup hook leaves no session open; meanwhile, of three bystander flow
  runs whose cycle events the test sends into the 15 s window, the automation cancels the one
  whose cycle never completed and spares the one whose cycle completed and the one the
  cleanup hook released (`whitney.run.released`, labelled `all`).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from flows.core.loop.stall_windows import STALL_WINDOWS_S
from flows.core.records.events import (
    ALL_WINDOWS,
    CYCLE_COMPLETED,
    CYCLE_STARTED,
    RUN_RELEASED,
    STALL_WINDOW_LABEL,
    flow_run_resource,
)

from .cdp import Chromium, find_chromium
from .conftest import EVALUATE_TRIGGER, LOG_DIR, Stack
from .harness import ARTIFACTS_DIR, REPO_ROOT, free_port, run_command, wait_for
from .test_deployments import assert_nothing_open, journal, sessions_of, trigger

TRAIN: dict[str, Any] = {
    "cycles": 2,
    "seed": 7,
    "prompts_per_cycle": 3,
    "group_size": 4,
    "max_tokens": 8,
    "checkpoint_every": 1,
    "eval_every": 1,
}
TIMEOUT_S = 240
SCREENSHOT = ARTIFACTS_DIR / "learning-curves-in-the-ui.png"
PROXIED_BLOCK = "whitney-behind-a-proxy"
STALL_FILE = REPO_ROOT / "deployments" / "stall-automations.yaml"
LOAD_EXPORTS = """
import json, sys
import torch
from peft import AutoPeftModelForCausalLM
from transformers import AutoModelForCausalLM, AutoTokenizer

target, prompt, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
AutoPeftModelForCausalLM.from_pretrained(f"{target}/adapter")
model = AutoModelForCausalLM.from_pretrained(f"{target}/merged")
tokens = AutoTokenizer.from_pretrained(f"{target}/merged")(prompt, return_tensors="pt")
with torch.no_grad():
    output = model.generate(**tokens, max_new_tokens=count, do_sample=False)
print(json.dumps(output[0, tokens.input_ids.shape[1] :].tolist()))
"""
"""Loads both exported directories offline and prints the merged model's greedy tokens."""

pytestmark = pytest.mark.timeout(600)


def wait_state(stack: Stack, flow_run_id: str, states: list[str]) -> dict[str, Any]:
    return stack.api.wait_flow_run(flow_run_id, states, TIMEOUT_S, evidence=stack.evidence)


def events_of(stack: Stack, flow_run_id: str, name: str) -> list[dict[str, Any]]:
    """The events named `name` about the flow run, oldest first."""
    found = stack.api.events([f"prefect.flow-run.{flow_run_id}"])
    return sorted((e for e in found if e["event"] == name), key=lambda e: e["occurred"])


def wait_events(stack: Stack, flow_run_id: str, name: str, count: int) -> list[dict[str, Any]]:
    """The flow run's events named `name`, once the server has `count` of them."""

    def probe() -> list[dict[str, Any]] | None:
        found = events_of(stack, flow_run_id, name)
        return found if len(found) >= count else None

    return wait_for(f"{count} {name} events of {flow_run_id}", probe, 60, interval=1)


def deployment_runs(stack: Stack, flow: str, name: str) -> list[dict[str, Any]]:
    deployment = stack.api.deployment(flow, name)
    return stack.api.post(
        "/flow_runs/filter", json={"flow_runs": {"deployment_id": {"any_": [deployment["id"]]}}}
    )


@pytest.fixture(scope="module")
def trained(stack: Stack) -> dict[str, Any]:
    """The RL run, evaluate-checkpoint's trigger on while it and its evaluations run: the flow
    run, its Whitney run id, its checkpoints and an evaluate-checkpoint run for each."""
    started = time.monotonic()
    stack.enable_automation(EVALUATE_TRIGGER, True)
    try:
        flow_run = trigger(stack, dict(TRAIN), "e2e: checkpoints to evaluate")
        done = wait_state(stack, flow_run["id"], ["COMPLETED"])
        saved = wait_events(stack, done["id"], "whitney.checkpoint.saved", TRAIN["cycles"])
        checkpoints = [event["payload"]["checkpoint"] for event in saved]

        def evaluated() -> list[dict[str, Any]] | None:
            runs = deployment_runs(stack, "evaluate-checkpoint", "evaluate-checkpoint")
            ours = [run for run in runs if run["parameters"].get("checkpoint") in checkpoints]
            states = {run["state_type"] for run in ours}
            if states & {"FAILED", "CRASHED", "CANCELLED"}:
                raise AssertionError(f"an evaluation ended {states}:\n{stack.evidence()}")
            return ours if len(ours) == len(checkpoints) and states == {"COMPLETED"} else None

        evaluations = wait_for(
            "an evaluation of each checkpoint", evaluated, TIMEOUT_S, evidence=stack.evidence
        )
    finally:
        stack.enable_automation(EVALUATE_TRIGGER, False)
    return {
        "flow_run": done,
        "run_id": saved[0]["payload"]["run_id"],
        "checkpoints": checkpoints,
        "evaluations": evaluations,
        "seconds": time.monotonic() - started,
    }


def test_every_checkpoint_is_evaluated_and_compared(alive: Stack, trained: dict[str, Any]) -> None:
    run_id, checkpoints = trained["run_id"], trained["checkpoints"]
    assert checkpoints == [
        f"whitney://runs/{run_id}/states/cycle-{n}" for n in range(TRAIN["cycles"])
    ]
    flow_run_id = trained["flow_run"]["id"]
    completed = wait_events(alive, flow_run_id, "whitney.cycle.completed", TRAIN["cycles"])
    inline = [event["payload"]["metrics"] for event in completed]
    (finished,) = wait_events(alive, flow_run_id, "whitney.run.finished", 1)
    exports = [op for op in journal(alive, run_id) if op.kind == "export_lora"]
    assert finished["payload"]["adapter_sha256"] == exports[-1].result["sha256"]
    for evaluation in trained["evaluations"]:  # each with the training flow's eval settings
        assert evaluation["parameters"]["config"]["evaluation"]["group_size"] == TRAIN["group_size"]
        assert evaluation["parameters"]["whitney_block"] == "whitney"

    tables = alive.api.post(
        "/artifacts/filter",
        json={"artifacts": {"key": {"any_": [f"checkpoint-evals-{run_id}"]}}, "limit": 50},
    )
    latest = max(tables, key=lambda artifact: artifact["created"])
    rows = json.loads(latest["data"])
    assert [row["uri"] for row in rows] == checkpoints
    for row, metrics in zip(rows, inline, strict=True):
        for name in ("reward_mean", "sampled_reward_mean", "pass_at_k"):
            assert row[name] == metrics[f"eval.{name}"], (row, metrics)
    evaluated = [
        event
        for run in trained["evaluations"]
        for event in wait_events(alive, run["id"], "whitney.checkpoint.evaluated", 1)
    ]
    assert sorted(event["payload"]["checkpoint"] for event in evaluated) == checkpoints


def test_the_learning_curves_show_in_the_ui(alive: Stack, trained: dict[str, Any]) -> None:
    binary = find_chromium()
    if binary is None:
        pytest.fail("Chromium is not installed (apt-get install chromium); CI installs it")
    artifacts = alive.api.artifacts([trained["flow_run"]["id"]])
    (summary,) = [a for a in artifacts if (a.get("key") or "").endswith("-summary")]
    assert "data:image/png;base64," in summary["data"]
    browser = Chromium(binary, LOG_DIR, alive.env)
    try:
        page = browser.page()
        page.navigate(f"{alive.ui_url}/artifacts/artifact/{summary['id']}")
        picture = (
            "[...document.images].find(image => image.src.startsWith('data:image/png')"
            " && image.complete && image.naturalWidth > 0)"
        )
        page.wait_js("the learning curves in the page", f"!!({picture})", timeout=60)
        size = page.evaluate(
            f"(() => {{ const i = {picture}; const r = i.getBoundingClientRect();"
            " return [i.naturalWidth, i.naturalHeight, r.width, r.height]; })()"
        )
        page.screenshot(SCREENSHOT)
    finally:
        browser.stop()
    assert size[:2] == [960, 600]  # reward, eval and loss panels, two to a row
    assert size[2] > 0 and size[3] > 0
    assert SCREENSHOT.stat().st_size > 10_000


def test_a_promotion_waits_for_approval_then_exports(
    alive: Stack, trained: dict[str, Any], tmp_path: Path
) -> None:
    final = trained["checkpoints"][-1]
    target = tmp_path / "promoted"
    evaluation = trained["evaluations"][-1]["parameters"]["config"]["evaluation"]
    config = {"checkpoint": final, "target_dir": str(target), "evaluation": evaluation}
    deployment = alive.api.deployment("promote-checkpoint", "promote-checkpoint")
    flow_run = alive.api.create_flow_run_from_deployment(
        deployment["id"], {"config": config}, "e2e: promote the final checkpoint"
    )
    paused = wait_state(alive, flow_run["id"], ["PAUSED"])
    sessions = sessions_of(alive, flow_run["id"])
    assert sessions and {session.status for session in sessions} == {"closed"}

    # the UI's Resume form: its description and schema, then the submission
    keyset = paused["state"]["state_details"]["run_input_keyset"]
    description = alive.api.get(f"/flow_runs/{flow_run['id']}/input/{keyset['description']}")
    schema = alive.api.get(f"/flow_runs/{flow_run['id']}/input/{keyset['schema']}")
    assert final in description and {"approve", "note"} <= set(schema["properties"])
    answer = alive.api.post(
        f"/flow_runs/{flow_run['id']}/resume",
        json={"run_input": {"approve": True, "note": "e2e: ship it"}},
    )
    assert answer["status"] == "ACCEPT", answer
    wait_state(alive, flow_run["id"], ["COMPLETED"])
    assert_nothing_open(alive, flow_run["id"])
    (decided,) = wait_events(alive, flow_run["id"], "whitney.promotion.decided", 1)
    assert decided["payload"] == {
        "checkpoint": final,
        "approved": True,
        "note": "e2e: ship it",
        "target_dir": str(target),
    }
    texts = [artifact["data"] for artifact in alive.api.artifacts([flow_run["id"]])]
    assert f"[{target}]({target.as_uri()})" in texts

    # the export came from a run created from the checkpoint: the training run's adapter
    runs = {run.run_id: run for run in whitney_runs_of(alive, flow_run["id"])}
    (exporter,) = [run for run in runs.values() if run.trainable]
    (frozen,) = [run for run in runs.values() if not run.trainable]
    exported = [op for op in journal(alive, exporter.run_id) if op.kind == "export_lora"]
    trained_exports = [op for op in journal(alive, trained["run_id"]) if op.kind == "export_lora"]
    assert exported[0].result["sha256"] == trained_exports[-1].result["sha256"]
    greedy = next(op for op in journal(alive, frozen.run_id) if op.kind == "sample")
    prompt = bytes(t for t in greedy_prompt(alive, frozen.run_id) if t < 256).decode()
    completed = subprocess.run(
        [sys.executable, "-c", LOAD_EXPORTS, str(target), prompt, str(TRAIN["max_tokens"])],
        env={**alive.env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    written = json.loads(completed.stdout.strip().splitlines()[-1])
    sampled = greedy.result["sequences"][0]["tokens"]
    assert written[: len(sampled)] == sampled


def whitney_runs_of(stack: Stack, flow_run_id: str) -> list[Any]:
    with stack.whitney_client() as client:
        return [
            client.get_run(run_id)
            for session in sessions_of(stack, flow_run_id)
            for run_id in client.get_session(session.session_id).run_ids or []
        ]


def greedy_prompt(stack: Stack, run_id: str) -> list[int]:
    """The prompt tokens of the run's first sample (the evaluation's first greedy request)."""
    path = stack.whitney_data / "journal.sqlite3"
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10) as db:
        (payload,) = db.execute(
            "SELECT payload FROM operations WHERE run_id = ? AND kind = 'sample'"
            " ORDER BY seq_id LIMIT 1",
            (run_id,),
        ).fetchone()
    return json.loads(payload)["prompt"]["token_ids"]


class HoldingProxy:
    """An HTTP proxy in front of the Whitney server that forwards each request as it is,
    unless told to hold: then requests wait until it is told to let go."""

    def __init__(self, upstream: str) -> None:
        self.upstream = httpx.Client(base_url=upstream, timeout=120)
        self.flowing = threading.Event()
        self.flowing.set()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def relay(self) -> None:
                proxy.flowing.wait()
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                answer = proxy.upstream.request(
                    self.command, self.path, content=body, headers=headers
                )
                self.send_response(answer.status_code)
                skip = {"content-length", "transfer-encoding", "connection", "content-encoding"}
                for key, value in answer.headers.items():
                    if key.lower() not in skip:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                self.wfile.write(answer.content)

            do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = relay

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.flowing.set()
        self.server.shutdown()
        self.server.server_close()
        self.upstream.close()


@pytest.fixture
def proxied(alive: Stack) -> Iterator[HoldingProxy]:
    """A holding proxy, and the block `whitney-behind-a-proxy` that points at it."""
    proxy = HoldingProxy(alive.whitney_url)
    try:
        run_command(
            [sys.executable, "-m", "blocks", "save", PROXIED_BLOCK, "--base-url", proxy.url],
            {**alive.env, "WHITNEY_API_KEY": alive.whitney_key},
            timeout=120,
            log_dir=LOG_DIR,
            name="block-save-proxied",
        )
        yield proxy
    finally:
        proxy.close()
        documents = alive.api.post(
            "/block_documents/filter", json={"block_documents": {"name": {"any_": [PROXIED_BLOCK]}}}
        )
        for document in documents:  # the other tests expect the one block they made
            alive.api._call("DELETE", f"/block_documents/{document['id']}")


@pytest.fixture
def stall_automations(alive: Stack) -> Iterator[list[str]]:
    """The stall automations, installed by docs/evaluation.md's command; deleted after the test."""
    names = [a["name"] for a in yaml.safe_load(STALL_FILE.read_text())["automations"]]
    prefect = str(Path(sys.executable).with_name("prefect"))
    command = ["automation", "create", "--from-file", "deployments/stall-automations.yaml"]
    run_command([prefect, *command], alive.env, timeout=120, log_dir=LOG_DIR, name="stall")
    try:
        yield names
    finally:
        found = alive.api.post(
            "/automations/filter", json={"automations": {"name": {"any_": names}}}
        )
        for automation in found:
            alive.api._call("DELETE", f"/automations/{automation['id']}")


BYSTANDER_EVENTS = {
    "stalled": [CYCLE_STARTED],
    "completed": [CYCLE_STARTED, CYCLE_COMPLETED],
    "released": [CYCLE_STARTED, RUN_RELEASED],
}
"""The cycle events sent for each bystander flow run."""
AUTOMATION_SLACK_S = 10
"""How long after its window the automation has surely acted (it took 0.6-3.9 s here)."""


def start_bystanders(stack: Stack) -> tuple[dict[str, str], float]:
    """Flow runs created Running, as a training run's would be, and the cycle events of
    BYSTANDER_EVENTS sent about each through the events API (15 s window; released: `all`);
    their ids by role, and when the events were sent (monotonic)."""
    flow = stack.api.post("/flows/", json={"name": "stall-bystander"})
    ids, sent = {}, []
    for role, names in BYSTANDER_EVENTS.items():
        run = stack.api.post(
            "/flow_runs/",
            json={"flow_id": flow["id"], "name": f"bystander-{role}", "state": {"type": "RUNNING"}},
        )
        ids[role] = run["id"]
        for name in names:
            window = ALL_WINDOWS if name == RUN_RELEASED else str(STALL_WINDOWS_S[0])
            sent.append(
                {
                    "id": str(uuid.uuid4()),
                    "occurred": datetime.now(UTC).isoformat(),
                    "event": name,
                    "resource": flow_run_resource(run["id"], **{STALL_WINDOW_LABEL: window}),
                    "payload": {},
                }
            )
    stack.api.post("/events", json=sent)
    return ids, time.monotonic()


def test_a_stalled_run_is_cancelled_and_leaves_nothing_open(
    alive: Stack, proxied: HoldingProxy, stall_automations: list[str]
) -> None:
    config = {**TRAIN, "cycles": 200, "eval_every": 0, "checkpoint_every": 0}
    config["stall"] = {"multiple": 2.0, "recent_cycles": 3}
    flow_run = trigger(alive, config, "e2e: stalls", block=PROXIED_BLOCK)

    def cycles_done() -> bool:
        runs = alive.api.child_flow_runs(flow_run["id"])
        return sum(run["state_type"] == "COMPLETED" for run in runs) >= 3

    wait_for(
        "three completed cycles", cycles_done, TIMEOUT_S, interval=0.5, evidence=alive.evidence
    )
    proxied.flowing.clear()  # Whitney stops answering
    bystanders, sent_at = start_bystanders(alive)
    stalled = wait_state(alive, flow_run["id"], ["CANCELLING", "CANCELLED"])
    proxied.flowing.set()  # and comes back, for the cleanup hook
    last = events_of(alive, flow_run["id"], "whitney.cycle.started")[-1]["payload"]
    window = last["stall_window_s"]
    assert window == min(w for w in STALL_WINDOWS_S if w >= 2.0 * last["recent_cycle_s"])
    completed = events_of(alive, flow_run["id"], "whitney.cycle.completed")
    assert last["cycle"] not in [e["payload"]["cycle"] for e in completed]  # it never did
    started_at = datetime.fromisoformat(
        events_of(alive, flow_run["id"], "whitney.cycle.started")[-1]["occurred"]
    )
    cancelled_after = datetime.fromisoformat(stalled["state"]["timestamp"]) - started_at
    assert cancelled_after >= timedelta(seconds=window)  # not before its window
    measured = {"recent_cycle_s": last["recent_cycle_s"], "window_s": window}
    measured["cancelled_after_s"] = cancelled_after.total_seconds()
    (LOG_DIR / "stall-measured.json").write_text(json.dumps(measured))  # evidence, for the logs
    automation_id = stalled["state"]["message"].removeprefix("Cancelled by Automation ").strip()
    automation = alive.api.get(f"/automations/{automation_id}")
    assert automation["name"] == f"whitney-flows-cancel-stalled-cycle-{window}s"
    wait_state(alive, flow_run["id"], ["CANCELLED"])
    assert_nothing_open(alive, flow_run["id"], timeout=120)
    # the hooks of the cycle subflow and of the flow run: the first closes the session
    released = wait_events(alive, flow_run["id"], "whitney.run.released", 1)
    assert sum(event["payload"]["sessions_closed"] for event in released) == 1

    time.sleep(max(0.0, sent_at + STALL_WINDOWS_S[0] + AUTOMATION_SLACK_S - time.monotonic()))
    states = {role: alive.api.flow_run(run_id)["state_type"] for role, run_id in bystanders.items()}
    for run_id in bystanders.values():  # they have no process: end them
        alive.api.set_flow_run_state(run_id, {"type": "CANCELLED"}, force=True)
    assert states["stalled"] in ("CANCELLING", "CANCELLED"), states
    assert (states["completed"], states["released"]) == ("RUNNING", "RUNNING"), states
