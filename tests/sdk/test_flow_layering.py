"""The arrows of `flows/`, read from the source with `ast` (imports inside functions count):
`cli -> {rl, sft, distill, dpo, sweep} -> core -> tasks -> blocks -> whitney` (and
`reap -> core`, `resume -> core`, `checkpoints -> core`), distill -> sft, checkpoints -> sft,
dpo -> sft (they read SFT data) the cross-flow arrows, `catalogue -> {rl, sft, distill, dpo}`
(their configs) the one list of training flows that cli, sweep and resume read, no import
cycle among the modules of flows/, and recipes, plans, configs, the catalogue and the
binding's pure modules (the connection, retry policy, names, release) load neither Prefect nor
torch. Imports under `if TYPE_CHECKING:` are annotations, not arrows."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("flows", "tasks", "blocks")

ALLOWED = {
    "flows.cli": {
        "flows.cli",
        "flows.rl",
        "flows.sft",
        "flows.distill",
        "flows.dpo",
        "flows.sweep",
        "flows.catalogue",
        "flows.core",
        "tasks",
        "blocks",
    },
    "flows.catalogue": {
        "flows.catalogue",
        "flows.rl",
        "flows.sft",
        "flows.distill",
        "flows.dpo",
        "flows.core",
    },
    "flows.rl": {"flows.rl", "flows.core", "tasks", "blocks"},
    "flows.sft": {"flows.sft", "flows.core", "tasks", "blocks"},
    "flows.dpo": {"flows.dpo", "flows.sft", "flows.core", "tasks", "blocks"},
    "flows.distill": {"flows.distill", "flows.sft", "flows.core", "tasks", "blocks"},
    "flows.reap": {"flows.reap", "flows.core", "tasks", "blocks"},
    "flows.resume": {"flows.resume", "flows.catalogue", "flows.core", "tasks", "blocks"},
    "flows.checkpoints": {"flows.checkpoints", "flows.sft", "flows.core", "tasks", "blocks"},
    "flows.sweep": {"flows.sweep", "flows.catalogue", "flows.core", "tasks", "blocks"},
    "flows.core": {"flows.core", "tasks", "blocks"},
    "flows": set(),
    "tasks": {"tasks", "blocks"},
    "blocks": {"blocks", "flows.core"},
}
"""Which layers of this repository each layer may import (whitney: any layer); blocks ->
flows.core is for `flows.core.config` alone (`test_blocks_reach_up_only_for_the_config`)."""
HEAVY = ("prefect", "torch")
PURE_SUFFIXES = (".config", ".plan", ".catalogue")
PURE_PACKAGES = (
    "flows.rl.recipes",
    "blocks.connection",
    "tasks.names",
    "tasks.retry",
    "tasks.release",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of flows/, tasks/ and blocks/, by dotted name."""
    return {
        module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")
    }


def is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node but those under `if TYPE_CHECKING:`."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and is_type_checking(child):
            for node in child.orelse:
                yield node
                yield from runtime_nodes(node)
            continue
        yield child
        yield from runtime_nodes(child)


def imports(path: Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, imported module) of every runtime import in the file; `from a import b` names
    module `a.b` when that is a module of the repository."""
    found: list[tuple[int, str]] = []
    for node in runtime_nodes(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.append((node.lineno, submodule if submodule in known else node.module))
    return sorted(set(found))


def layer(module: str) -> str | None:
    """The layer of a module of this repository (None outside flows/, tasks/ and blocks/)."""
    parts = module.split(".")
    if parts[0] in ("tasks", "blocks"):
        return parts[0]
    if parts[0] != "flows":
        return None
    return "flows" if len(parts) == 1 else f"flows.{parts[1]}"


def is_pure(module: str) -> bool:
    return module.endswith(PURE_SUFFIXES) or module.startswith(PURE_PACKAGES)


def graph() -> dict[str, list[tuple[int, str]]]:
    """Each module's imports of other modules of these packages, with their lines."""
    found = modules()
    known = set(found)
    return {
        module: [(line, target) for line, target in imports(path, known) if target in known]
        for module, path in found.items()
    }


def test_every_arrow_points_down_the_layers() -> None:
    found = modules()
    known = set(found)
    wrong = []
    for module, path in found.items():
        allowed = ALLOWED[layer(module)]
        for line, target in imports(path, known):
            target_layer = layer(target)
            if target_layer is not None and target_layer not in allowed:
                wrong.append(f"{module} ({path.name}:{line}) imports {target}")
    assert wrong == [], "wrong arrows:\n" + "\n".join(wrong)


def test_recipes_plans_and_configs_load_neither_prefect_nor_torch() -> None:
    found = modules()
    known = set(found)
    arrows = graph()
    wrong = []
    for module in sorted(filter(is_pure, found)):
        seen, stack = {module}, [(module, [module])]
        while stack:
            current, chain = stack.pop()
            for line, target in imports(found[current], known):
                if target.split(".")[0] in HEAVY:
                    wrong.append(f"{' -> '.join(chain)} imports {target} (line {line})")
            for _, target in arrows[current]:
                if target not in seen:
                    seen.add(target)
                    stack.append((target, [*chain, target]))
    assert wrong == [], "heavy imports from pure modules:\n" + "\n".join(wrong)


def test_no_import_cycle() -> None:
    arrows = graph()
    cycles: list[str] = []
    state: dict[str, str] = {}

    def visit(module: str, chain: list[str]) -> None:
        state[module] = "open"
        for line, target in arrows[module]:
            if state.get(target) == "open":
                start = chain.index(target) if target in chain else 0
                cycles.append(" -> ".join([*chain[start:], target]) + f" (line {line})")
            elif target not in state:
                visit(target, [*chain, target])
        state[module] = "done"

    for module in sorted(arrows):
        if module not in state:
            visit(module, [module])
    assert cycles == [], "import cycles:\n" + "\n".join(cycles)


def test_the_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import prefect\n"
        "def later():\n    import torch\n",
        encoding="utf-8",
    )
    assert imports(source, set()) == [(1, "typing"), (5, "torch")]


def test_only_tasks_use_the_process_wide_client() -> None:
    """A flow reaches Whitney through tasks; code outside a task (the CLI, the cleanup hooks,
    the reaper) owns a client for as long as it needs one (`connection.get_client()`)."""
    wrong = [
        f"{module} ({path.name}:{node.lineno})"
        for module, path in modules().items()
        if layer(module) not in ("tasks", "blocks")
        for node in runtime_nodes(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom)
        and node.module == "blocks.connection"
        and "client_for" in {alias.name for alias in node.names}
    ]
    assert wrong == [], "client_for outside tasks/:\n" + "\n".join(wrong)


def test_blocks_reach_up_only_for_the_config() -> None:
    """blocks/ -> flows/ is `flows.core.config` (the ConfigError naming a field), nothing else."""
    wrong = [
        f"{module} ({line}) imports {target}"
        for module, arrows in graph().items()
        if layer(module) == "blocks"
        for line, target in arrows
        if target.startswith("flows") and target != "flows.core.config"
    ]
    assert wrong == [], "blocks/ reaching up:\n" + "\n".join(wrong)


def test_the_design_map_draws_the_table() -> None:
    """docs/design.md's arrows, one line a layer, are the `ALLOWED` table (less self-arrows)."""
    text = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    block = text.split("### The import arrows", 1)[1].split("```", 2)[1]
    drawn = {}
    for line in block.strip().splitlines():
        source, _, targets = re.sub(r"\(.*?\)", "", line).partition("->")
        drawn[source.strip()] = {target.strip() for target in targets.split(",")}
    table = {name: allowed - {name} for name, allowed in ALLOWED.items() if allowed - {name}}
    assert drawn == table
