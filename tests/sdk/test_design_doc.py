"""docs/design.md names only what exists: every repository path in backticks, every
`file.py:name` and every dotted `package.module.name` reference, read from the source with
`ast` (nothing is imported), and the reading-order list has the length the page states."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "design.md"
PACKAGES = ("whitney", "flows", "tasks", "blocks")

FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
SPAN = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"^[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*/?$")
FILE_REF = re.compile(r"^(?P<file>[A-Za-z0-9_./-]+\.py):(?P<name>[A-Za-z_][\w.]*)$")
DOTTED = re.compile(rf"^(?:{'|'.join(PACKAGES)})(?:\.[A-Za-z_]\w*)+$")


def spans() -> list[str]:
    """Every inline code span of the page, outside fenced blocks."""
    return SPAN.findall(FENCE.sub("", DOC.read_text(encoding="utf-8")))


@functools.cache
def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def defined(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a module or class body binds: defs, classes, assignments, imports."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    names[target.id] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, ast.ImportFrom | ast.Import):
            for alias in node.names:
                names[(alias.asname or alias.name).split(".")[0]] = node
    return names


def resolves(path: Path, qualname: str) -> bool:
    """Whether `qualname` (`name` or `Class.member`) is bound in the module at `path`."""
    body: list[ast.stmt] = tree(path).body
    for part in qualname.split("."):
        node = defined(body).get(part)
        if node is None:
            return False
        body = node.body if isinstance(node, ast.ClassDef) else []
    return True


def module_file(dotted: str) -> Path | None:
    """The source file of a module or package of the repository, if it is one."""
    base = ROOT.joinpath(*dotted.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def test_every_path_exists() -> None:
    missing = [
        span
        for span in spans()
        if "/" in span and PATH.match(span) and not (ROOT / span.rstrip("/")).exists()
    ]
    assert missing == [], f"paths in docs/design.md that do not exist: {missing}"


def test_every_file_reference_resolves() -> None:
    references = [match for span in spans() if (match := FILE_REF.match(span))]
    assert references, "the page should cite functions as `file.py:name`"
    wrong = []
    for match in references:
        path = ROOT / match["file"]
        if not path.is_file():
            wrong.append(f"{match[0]}: no such file")
        elif not resolves(path, match["name"]):
            wrong.append(f"{match[0]}: {match['name']} is not defined there")
    assert wrong == [], "\n".join(wrong)


def test_every_dotted_reference_resolves() -> None:
    wrong = []
    for span in filter(DOTTED.match, spans()):
        parts = span.split(".")
        for split in range(len(parts), 0, -1):
            path = module_file(".".join(parts[:split]))
            if path is not None:
                rest = ".".join(parts[split:])
                if rest and not resolves(path, rest):
                    wrong.append(f"{span}: {rest} is not defined in {path.relative_to(ROOT)}")
                break
        else:
            wrong.append(f"{span}: no such module")
    assert wrong == [], "\n".join(wrong)


def test_the_reading_order_has_the_length_it_states() -> None:
    text = DOC.read_text(encoding="utf-8")
    section = text.split("### The files to read in order", 1)[1].split("\n## ", 1)[0]
    stated = re.search(r"takes \*\*(\d+)\*\* files", section)
    assert stated is not None, "the section should state how many files it takes"
    items = re.findall(r"^\d+\. `([^`]+)`", section, re.MULTILINE)
    assert len(items) == int(stated[1]) <= 8  # issue 12: a cycle in at most 8 files
    assert all(item.startswith(("flows/", "tasks/")) and (ROOT / item).is_file() for item in items)
    assert len(set(items)) == len(items)


def test_the_checks_catch_a_wrong_reference() -> None:
    sample = ROOT / "flows" / "core" / "loop" / "context.py"
    assert resolves(sample, "CycleContext.run_tail") and resolves(sample, "CycleTail.checkpoint")
    assert not resolves(sample, "no_such_function")
    assert module_file("flows.core.loop.context") == sample
    assert FILE_REF.match("flows/rl/flow.py:rl_flow") and not DOTTED.match("whitney-flows.role")
