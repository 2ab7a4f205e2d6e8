"""The Prefect UI in headless Debian Chromium: rl-on-demand's custom run form, filled and
submitted as a user would (real mouse clicks and typing over the DevTools protocol); the run
it starts carries the typed value and completes. The credentials block page never shows the
key.

Chromium is required: without it this test fails (CI installs it with apt-get).
A screenshot of the filled form is saved as test-artifacts/rl-on-demand-custom-run-form.png.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .cdp import Chromium, Page, find_chromium
from .conftest import BLOCK_NAME, LOG_DIR, RL_DEPLOYMENT, Stack
from .harness import ARTIFACTS_DIR, wait_for

SCREENSHOT = ARTIFACTS_DIR / "rl-on-demand-custom-run-form.png"
SUBMIT_TIMEOUT_SCREENSHOT = ARTIFACTS_DIR / "rl-on-demand-submit-timeout.png"
CYCLES = 2

pytestmark = pytest.mark.timeout(300)


def by_text(selector: str, text: str) -> str:
    """JavaScript for the first `selector` element whose trimmed text is `text`."""
    return (
        f"[...document.querySelectorAll({json.dumps(selector)})]"
        f".find(el => el.textContent.trim() === {json.dumps(text)})"
    )


def form_input(label_prefix: str) -> str:
    """JavaScript for the input of the schema-form property whose label starts so."""
    return (
        "[...document.querySelectorAll('.schema-form-property')].find(el => el.querySelector("
        f"'.schema-form-property__label')?.textContent.trim().startsWith({json.dumps(label_prefix)}))"
        "?.querySelector('input, textarea')"
    )


def page_evidence(page: Page, screenshot: Path) -> str:
    """Where the page is and what it says (its last lines), with a screenshot saved."""
    page.screenshot(screenshot)
    where = page.evaluate("location.href")
    text = page.evaluate("document.body.innerText")[-1500:]
    return f"page: {where}, screenshot: {screenshot}\n{text}"


SERVER_ERROR_TOAST = "Oops. Something went wrong."
"""The UI's toast for an API answer of 5xx or no answer (SQLite's "database is locked" under
load is one: the Prefect server then answers 500)."""
SUBMIT_ATTEMPTS = 3


def submitted_after_all(page: Page, stack: Stack, run_name: str) -> bool:
    """Whether, within 10 s of a server-error toast (which may be another request's), the
    page leaves the form or a run of that name exists."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if page.evaluate("!location.pathname.endsWith('/run')"):
            return True
        query = {"flow_runs": {"name": {"any_": [run_name]}}}
        if stack.api.post("/flow_runs/filter", json=query):
            return True
        time.sleep(0.5)
    return False


def submit(page: Page, stack: Stack, run_name: str) -> None:
    """Click Submit until the form leaves for the new run's page; as a user would, click it
    again when the UI says the server failed and no run of that name was created (the UI
    shows that toast once per page load, so a second failure ends in the 90 s wait)."""
    for attempt in range(1, SUBMIT_ATTEMPTS + 1):
        page.click(by_text("button", "Submit"))
        outcome = wait_for(
            "the form to submit",
            lambda: (
                "submitted"
                if page.evaluate("!location.pathname.endsWith('/run')")
                else "server error"
                if SERVER_ERROR_TOAST in page.evaluate("document.body.innerText")
                else None
            ),
            90,
            evidence=lambda: page_evidence(page, SUBMIT_TIMEOUT_SCREENSHOT) + stack.evidence(),
        )
        if outcome == "submitted" or submitted_after_all(page, stack, run_name):
            return
        print(f"submit attempt {attempt}: the Prefect server answered an error; submitting again")
        page.evaluate(
            "[...document.querySelectorAll('button')].filter(b => b.textContent.trim() === "
            "'Close').forEach(b => b.click())"
        )
        page.wait_js(
            "the toast to close",
            f"!document.body.innerText.includes({json.dumps(SERVER_ERROR_TOAST)})",
        )
    raise AssertionError(
        f"the Prefect server failed {SUBMIT_ATTEMPTS} submissions of the form\n"
        + page_evidence(page, SUBMIT_TIMEOUT_SCREENSHOT)
        + stack.evidence()
    )


RUN_NAME_INPUT = (
    "[...document.querySelectorAll('.p-label')].find(el => el.querySelector('.p-label__label')"
    "?.textContent.trim() === 'Run Name')?.querySelector('input')"
)


@pytest.fixture(scope="session")
def chromium() -> str:
    """Debian's Chromium; the test fails without it (not a skip: CI must run it)."""
    binary = find_chromium()
    if binary is None:
        pytest.fail(
            "Chromium is not installed: the browser test needs Debian's chromium "
            "(apt-get install chromium); CI installs it"
        )
    return binary


@pytest.fixture
def page(chromium: str, stack: Stack) -> Iterator[Page]:
    browser = Chromium(chromium, LOG_DIR, stack.env)
    try:
        yield browser.page()
    finally:
        browser.stop()


def test_the_custom_run_form_starts_a_run_with_the_typed_cycles(
    chromium: str, stack: Stack, page: Page
) -> None:
    stack.check_alive()
    page.navigate(f"{stack.ui_url}/deployments")
    deployment_link = by_text("a", RL_DEPLOYMENT)
    page.wait_js("the deployments list", f"!!({deployment_link})", timeout=45)
    page.click(deployment_link)
    page.wait_js("the deployment page", "location.pathname.startsWith('/deployments/deployment/')")
    run_button = by_text("button", "Run")
    page.wait_js("the Run button", f"!!({run_button})")
    page.click(run_button)
    custom_run = by_text("a", "Custom run")
    page.wait_js("the Run menu", f"!!({custom_run})")
    page.click(custom_run)
    page.wait_js("the custom run form", "location.pathname.endsWith('/run')")
    cycles_input = form_input("Cycles")
    page.wait_js("the Cycles field", f"!!({cycles_input})", timeout=30)

    # the pydantic config, field by field, with descriptions and defaults
    text = page.evaluate("document.body.innerText")
    for expected in ("Number of training cycles", "Sampling temperature", "whitney_block"):
        assert expected in text
    schema = stack.deployment()["parameter_openapi_schema"]
    default_cycles = schema["definitions"]["RLConfig"]["properties"]["cycles"]["default"]
    assert page.evaluate(f"({cycles_input}).value") == str(default_cycles) != str(CYCLES)
    assert page.evaluate(f"({form_input('whitney_block')}).value") == BLOCK_NAME

    page.click(cycles_input)
    page.select_all()
    page.type_text(str(CYCLES))
    assert page.evaluate(f"({cycles_input}).value") == str(CYCLES)
    run_name = page.evaluate(f"({RUN_NAME_INPUT}).value")
    assert run_name
    page.screenshot(SCREENSHOT)

    submit(page, stack, run_name)

    runs = stack.api.post("/flow_runs/filter", json={"flow_runs": {"name": {"any_": [run_name]}}})
    assert len(runs) == 1, runs
    flow_run = runs[0]
    assert flow_run["parameters"]["config"]["cycles"] == CYCLES
    assert flow_run["parameters"]["whitney_block"] == BLOCK_NAME
    done = stack.api.wait_flow_run(flow_run["id"], ["COMPLETED"], 180, evidence=stack.evidence)
    cycles = stack.api.child_flow_runs(done["id"])
    assert sorted(run["name"] for run in cycles) == [f"cycle-{n}" for n in range(CYCLES)]
    assert {run["state_type"] for run in cycles} == {"COMPLETED"}


def test_the_block_page_never_shows_the_key(chromium: str, stack: Stack, page: Page) -> None:
    documents = stack.api.post(
        "/block_documents/filter",
        json={"block_types": {"slug": {"any_": ["whitney-credentials"]}}},
    )
    page.navigate(f"{stack.ui_url}/blocks/block/{documents[0]['id']}")
    page.wait_js(
        "the block page", f"document.body.innerText.includes({json.dumps(stack.whitney_url)})"
    )
    assert "********" in page.evaluate("document.body.innerText")
    assert stack.whitney_key not in page.evaluate("document.documentElement.outerHTML")
