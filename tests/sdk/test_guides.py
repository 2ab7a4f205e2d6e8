"""README.md is a front door and docs/ holds the guides: the README stays short, keeps the
Quickstart CI runs, and maps every guide; every relative link of the README and the guides
reaches a file (and a heading, for an anchor), and every repository path a guide names in
backticks exists."""

from __future__ import annotations

import re
import subprocess
from dataclasses import fields
from pathlib import Path

from tests.sdk.markdown import table
from whitney.local.limits import Limits
from whitney.losses import LOSS_FUNCTIONS, PROVIDER_LOSS_SUPPORT

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CONTRACTS = {"api.md", "design.md", "losses.md"}
GUIDES = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in CONTRACTS)
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)\)")
SPAN = re.compile(r"`([^`\n]+)`")
TOP = (
    "whitney",
    "flows",
    "tasks",
    "blocks",
    "deployments",
    "tests",
    "benchmarks",
    "examples",
)
REPO_PATH = re.compile(rf"^(?:{'|'.join(TOP)})(?:/[A-Za-z0-9_.-]+)*/?$")
MAIN_JOB = 'pip install -e ".[local]" && whitney-flows run rl'


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """A page's headings' anchors and its `<a id="...">` ones (docs/measured.md's rows)."""
    text = FENCE.sub("", path.read_text())
    headings = {slug(h) for h in re.findall(r"^#+ (.*)$", text, re.MULTILINE)}
    return headings | set(re.findall(r'<a id="([^"]+)"></a>', text))


def exists(span: str) -> bool:
    """A path of the repository, or a module named without its `.py` (`flows/core/loop/cycles`)."""
    path = ROOT / span.rstrip("/")
    return path.exists() or path.with_suffix(".py").is_file()


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 250
    headings = [line for line in lines if line.startswith("## ")]
    assert "## Quickstart" in headings and "## Guides" in headings


def test_ci_finds_the_quickstart_main_job() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    program = re.search(r"quickstart=\$\(awk '([^']+)' README.md\)", ci)
    assert program, "the awk that .ci/run extracts the Quickstart with"
    job = subprocess.run(
        ["awk", program[1], str(README)], capture_output=True, text=True, check=True
    ).stdout
    assert job.split("#")[0].strip() == MAIN_JOB


def test_the_readme_maps_every_guide() -> None:
    linked = set(LINK.findall(README.read_text()))
    assert {f"docs/{guide.name}" for guide in GUIDES} <= linked


def test_every_relative_link_resolves() -> None:
    wrong = []
    for page in [README, *GUIDES, *(ROOT / "docs" / name for name in CONTRACTS)]:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists():
                wrong.append(f"{page.name}: {target}: no such file")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                wrong.append(f"{page.name}: {target}: no such heading")
    assert wrong == []


def test_every_path_a_guide_names_exists() -> None:
    missing = [
        f"{page.name}: {span}"
        for page in [README, *GUIDES]
        for span in SPAN.findall(FENCE.sub("", page.read_text()))
        if REPO_PATH.match(span) and "/" in span and not exists(span)
    ]
    assert missing == []


def table_rows(page: str, header: str) -> list[list[str]]:
    """The cells of each row of the markdown table of docs/`page` whose header is `header`."""
    return table((ROOT / "docs" / page).read_text(), header)


def test_the_rl_guides_loss_table_is_the_sdks() -> None:
    rows = table_rows("rl.md", "| `loss` | what it trains | `loss_config` (defaults) | providers |")
    served = {row[0].strip("`"): set(row[-1].split(", ")) for row in rows}
    assert served == {
        loss: {p for p, losses in PROVIDER_LOSS_SUPPORT.items() if loss in losses}
        for loss in LOSS_FUNCTIONS
    }


def test_the_limits_guide_lists_every_limit_with_its_default() -> None:
    documented = {}
    for flags, defaults, _ in table_rows("limits.md", "| flag | default | bounds |"):
        names = [flag.removeprefix("--").replace("-", "_") for flag in SPAN.findall(flags)]
        documented |= dict(zip(names, map(int, defaults.split(", ")), strict=True))
    assert documented == {item.name: getattr(Limits(), item.name) for item in fields(Limits)}


def test_the_checks_catch_a_wrong_link_and_path() -> None:
    assert slug("Async off-policy RL (`max_staleness`)") == "async-off-policy-rl-max_staleness"
    assert "inspect-and-retry-a-cycle" in anchors(ROOT / "docs" / "prefect-server.md")
    assert "engine-group" in anchors(ROOT / "docs" / "measured.md")
    assert REPO_PATH.match("flows/rl/recipes/") and not REPO_PATH.match("local/tiny")
