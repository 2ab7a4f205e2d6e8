"""docs/measured.md holds every measured figure once, in one table per area; each row names its
command (and every file, test and flag it names exists), its machine, date or commit and load;
the README and the guides link to its rows instead of repeating their figures."""

from __future__ import annotations

import re
from pathlib import Path

from tests.sdk.markdown import table

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "docs" / "measured.md"
README = ROOT / "README.md"
CONTRACTS = {"api.md", "design.md", "losses.md", "measured.md"}
GUIDES = sorted(p for p in (ROOT / "docs").glob("*.md") if p.name not in CONTRACTS)
AREAS = [
    "Engine speed and aims",
    "Learning results",
    "Reliability, soak and chaos",
    "Server and orchestration overhead",
    "Tinker front",
]
HEADER = "| what | figure | command | machine | date/commit | load |"
ROW_ID = re.compile(r'^<a id="([a-z0-9-]+)"></a>\S')
CODE = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"\b(?:benchmarks|tests|examples)/[\w./-]+\.(?:py|toml)\b")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
UNCOMMITTED = ("no committed command", "by hand")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
INDENTED = re.compile(r"^(?: {4}|\t).*$", re.MULTILINE)
FIGURE = re.compile(
    r"\b\d+(?:\.\d+)?×|\b\d+\.\d+ ?(?:s|ms|min|minutes|GiB|GFLOPS)\b|\b\d+\.\d+e-\d+\b"
)
"""A measured-looking figure: a ratio, seconds, minutes, memory or a rate with a decimal, or a
difference such as 5.2e-5 (settings are whole: a 300 s lease, 2 GiB, a bound of 1e-4)."""


def sections() -> dict[str, str]:
    """measured.md's text under each `## ` heading, by heading."""
    parts = re.split(r"^## (.+)$", MEASURED.read_text(), flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def rows() -> list[list[str]]:
    """Every row of every area's table."""
    return [row for area in AREAS for row in table(sections()[area], HEADER)]


def prose(path: Path) -> str:
    """A page's text outside code blocks (fenced or indented: those show a command's output)."""
    return INDENTED.sub("", FENCE.sub("", path.read_text()))


def test_one_table_per_area_and_nothing_else() -> None:
    assert list(sections()) == AREAS
    for area, text in sections().items():
        assert text.count(HEADER) == 1, area
        assert [line for line in text.splitlines() if line.startswith("|")][0] == HEADER
    assert len(rows()) > 40


def test_every_row_has_an_id_and_every_column() -> None:
    ids = []
    for row in rows():
        assert len(row) == 6 and all(row), row
        found = ROW_ID.match(row[0])
        assert found, row[0]
        ids.append(found[1])
    assert len(ids) == len(set(ids))


def test_every_rows_command_exists() -> None:
    """A row's command is a committed one, or says it is not; the scripts, tests and examples
    it names exist, a test's `-k NAME` names a test of that file, and a benchmark's flags are
    the script's own."""
    wrong = []
    for row in rows():
        command = row[2]
        spans = CODE.findall(command)
        if not spans:
            assert any(phrase in command for phrase in UNCOMMITTED), row[0]
            continue
        for span in spans:
            for path in PATH.findall(span):
                source = ROOT / path
                if not source.is_file():
                    wrong.append(f"{row[0]}: {path}")
                    continue
                text = source.read_text()
                selected = re.search(r"-k (\w+)", span)
                if path.startswith("tests/") and selected and selected[1] not in text:
                    wrong.append(f"{row[0]}: {path} has no {selected[1]}")
                if path.startswith("benchmarks/"):
                    flags = FLAG.findall(span.split(path, 1)[1])
                    wrong += [f"{row[0]}: {path} {flag}" for flag in flags if flag not in text]
    assert wrong == []


def test_the_readme_links_rows_and_states_no_figure_of_its_own() -> None:
    measured = MEASURED.read_text()
    text = prose(README)
    assert "docs/measured.md#" in text
    stray = [figure for figure in FIGURE.findall(text) if figure not in measured]
    assert stray == []


def test_no_guide_repeats_a_measured_figure() -> None:
    """A guide links to measured.md's row instead of stating a measured figure."""
    found = {
        page.name: FIGURE.findall(prose(page))
        for page in [README, *GUIDES]
        if FIGURE.findall(prose(page))
    }
    assert found == {}


def test_the_checks_catch_a_figure_and_a_wrong_command() -> None:
    text = "took 53.9 minutes, 1.48× PEFT, 3.20 GiB, 5.2 s, 5.2e-5; 300 s, 2 GiB, 1e-4"
    assert FIGURE.findall(text) == ["53.9 minutes", "1.48×", "3.20 GiB", "5.2 s", "5.2e-5"]
    assert FLAG.findall("--rounds 2 --memory 16x1024 (`-k x`)") == ["--rounds", "--memory"]
    assert ROW_ID.match('<a id="engine-group"></a>a group') and not ROW_ID.match("a group")
