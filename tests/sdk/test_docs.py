"""docs/api.md and docs/losses.md match the code they describe.

No server, no torch: the server's and the engine's facts are read from their source with
`ast` (importing the engine would import torch); the SDK's are imported.
"""

from __future__ import annotations

import ast
import re
import tempfile
from functools import cache
from pathlib import Path

import pytest

from tests.local.helpers import declared_routes
from tests.sdk.markdown import table
from whitney import errors, losses, wire
from whitney.local.openai_routes import is_openai_path

ROOT = Path(__file__).resolve().parents[2]
API = (ROOT / "docs" / "api.md").read_text()
LOSSES = (ROOT / "docs" / "losses.md").read_text()
LOCAL = ROOT / "whitney" / "local"
ENGINE = LOCAL / "engine"
TICKED = re.compile(r"`([^`]+)`")
METRIC = re.compile(r"[a-z_]+:(?:sum|mean)")
PROVIDERS = ("modal", "tinker", "local")


# --------------------------------------------------------------------------- helpers


@cache
def module(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def constant(path: Path, name: str) -> object:
    """The literal value of a module-level `name = ...` in `path`."""
    for node in module(path).body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return ast.literal_eval(node.value)
    raise LookupError(f"{name} is not assigned in {path}")


def assigns(path: Path, name: str) -> bool:
    return any(
        isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Store)
        for node in ast.walk(module(path))
    )


def function(path: Path, name: str) -> ast.FunctionDef:
    for node in ast.walk(module(path)):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(f"no function {name} in {path}")


def called_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def section(text: str, heading: str) -> str:
    """The lines under the line `heading`, up to the next heading of its level or higher."""
    lines = text.splitlines()
    assert heading in lines, f"missing heading {heading!r}"
    level = len(heading) - len(heading.lstrip("#"))
    body = []
    for line in lines[lines.index(heading) + 1 :]:
        match = re.match(r"(#+) ", line)
        if match and len(match.group(1)) <= level:
            break
        body.append(line)
    return "\n".join(body)


def flat(text: str) -> str:
    return " ".join(text.split())


# --------------------------------------------------------------------------- losses.md


def loss_section(loss: str) -> str:
    return section(LOSSES, f"## `{loss}`")


def bullet(text: str, name: str) -> str:
    match = re.search(rf"^- \*\*{name}\*\*: (.*)$", text, re.M)
    assert match, f"no **{name}** line"
    return match.group(1)


def engine_metrics() -> dict[str, set[str]]:
    """Each loss function's metric names in the engine's source (base_metrics' included)."""
    path = ENGINE / "losses.py"

    def names(node: ast.AST) -> set[str]:
        return {
            n.value
            for n in ast.walk(node)
            if isinstance(n, ast.Constant)
            and isinstance(n.value, str)
            and METRIC.fullmatch(n.value)
        }

    base = names(function(path, "base_metrics"))
    out = {}
    for loss in losses.LOSS_FUNCTIONS:
        fn = function(path, loss)
        calls_base = any(
            isinstance(n, ast.Call) and called_name(n.func) == "base_metrics" for n in ast.walk(fn)
        )
        out[loss] = names(fn) | (base if calls_base else set())
    return out


def test_the_engine_serves_every_loss_name_of_the_sdk():
    policy = next(
        node.value
        for node in module(ENGINE / "losses.py").body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "POLICY"
    )
    served = {key.value for key in policy.keys} | {"ppo_critic"}
    assert served == set(losses.LOSS_FUNCTIONS)


def test_the_off_policy_section_is_the_codes():
    text = section(LOSSES, "## Off-policy datums (`max_staleness` > 0)")
    decoupled = text.split("decoupled clipping")[0].rsplit("\n- ", 1)[1]
    named = set(re.findall(r"`(\w+)`", decoupled)) - {"ppo_critic"}
    assert named == set(constant(ROOT / "flows" / "rl" / "off_policy.py", "DECOUPLED_LOSSES"))
    (cap,) = set(re.findall(r"min\(exp\(p_t - q_t\), ([\d.]+)\)", text))
    assert float(cap) == constant(ROOT / "flows" / "rl" / "off_policy.py", "BEHAVIOUR_WEIGHT_CAP")


def test_every_loss_has_a_section_and_nothing_else_does():
    documented = re.findall(r"^## `(\w+)`$", LOSSES, re.M)
    assert sorted(documented) == sorted(losses.LOSS_FUNCTIONS)


@pytest.mark.parametrize("loss", losses.LOSS_FUNCTIONS)
def test_a_loss_section_states_the_engine_defaults(loss):
    line = bullet(loss_section(loss), "Defaults")
    documented = {key: float(value) for key, value in re.findall(r"`(\w+)` = ([-+.\deE]+)", line)}
    expected = constant(ENGINE / "validation.py", "LOSS_CONFIG_DEFAULTS").get(loss, {})
    assert documented == expected
    if not expected:
        assert line == "none"


@pytest.mark.parametrize("loss", losses.LOSS_FUNCTIONS)
def test_a_loss_section_states_its_required_inputs(loss):
    line = bullet(loss_section(loss), "Requires")
    assert TICKED.findall(line) == list(losses.REQUIRED_LOSS_INPUTS[loss])


@pytest.mark.parametrize("loss", losses.LOSS_FUNCTIONS)
def test_a_loss_section_states_the_metrics_the_engine_returns(loss):
    line = bullet(loss_section(loss), "Metrics")
    documented = {name for name in TICKED.findall(line) if METRIC.fullmatch(name)}
    assert documented == engine_metrics()[loss]


def test_the_loss_inputs_table_is_what_the_engine_reads():
    rows = table(LOSSES, "| name | dtype | read by | when a datum lacks it |")
    names = [row[0].strip("`") for row in rows]
    read = {"target_tokens", *constant(ENGINE / "validation.py", "FLOAT_INPUTS")}
    assert sorted(names) == sorted(read)
    required = {name for names in losses.REQUIRED_LOSS_INPUTS.values() for name in names}
    for row in rows:
        assert row[-1].startswith("required") == (row[0].strip("`") in required), row


def test_the_provider_table_is_the_sdks():
    rows = table(LOSSES, "| loss | `modal` | `tinker` | `local` |")
    assert sorted(row[0].strip("`") for row in rows) == sorted(losses.LOSS_FUNCTIONS)
    documented = {}
    for loss_cell, *cells in rows:
        for provider, cell in zip(PROVIDERS, cells, strict=True):
            if cell != "not served":
                assert cell == "none" or TICKED.findall(cell), cell
                documented[provider, loss_cell.strip("`")] = frozenset(TICKED.findall(cell))
    expected = {
        (provider, loss): losses.LOSS_CONFIG_KEYS[provider].get(loss, frozenset())
        for provider in PROVIDERS
        for loss in losses.PROVIDER_LOSS_SUPPORT[provider]
    }
    assert documented == expected


def test_the_per_token_clip_table_is_the_sdks():
    rows = table(LOSSES, "| provider | per-token clip tensors |")
    accepted = {row[0].strip("`") for row in rows if row[1].startswith("accepted")}
    assert sorted(row[0].strip("`") for row in rows) == sorted(PROVIDERS)
    assert accepted == set(losses.PER_TOKEN_CLIP_PROVIDERS)


# --------------------------------------------------------------------------- api.md


@cache
def app_routes() -> dict[str, bool]:
    """`METHOD /path` of every route of the embedded server's app -> whether it is in the
    OpenAPI document (the training API's routes) or not (the OpenAI-compatible ones, Tinker's,
    the document's own)."""
    with tempfile.TemporaryDirectory() as scratch:
        declared = declared_routes(Path(scratch))
    return {f"{method.upper()} {path}": named for (method, path), named in declared.items()}


def test_every_route_of_the_app_has_a_section_and_a_row():
    routes = {route for route, in_document in app_routes().items() if in_document}
    assert len(routes) == 15
    headings = set(re.findall(r"^### `((?:GET|POST|PUT|PATCH|DELETE) /\S*)`$", API, re.M))
    assert headings == routes
    rows = table(API, "| method and path | what | tag |")
    assert {row[0].strip("`") for row in rows} == routes


def test_the_openai_compatible_routes_have_their_rows_and_no_section():
    routes = {
        route
        for route, in_document in app_routes().items()
        if not in_document and is_openai_path(route.split()[1])
    }
    assert routes == {"GET /v1/models", "POST /v1/chat/completions", "POST /v1/completions"}
    rows = table(section(API, "## OpenAI-compatible routes"), "| method and path | what |")
    assert {row[0].strip("`") for row in rows} == routes
    assert not routes & set(re.findall(r"^### `(\S+ /\S*)`$", API, re.M))


def server_error_types() -> set[str]:
    """Every error type the embedded server can answer or record: the errors built under
    whitney/local, and those of whitney.losses that the provider emulation passes on."""
    paths = [*sorted(LOCAL.rglob("*.py")), ROOT / "whitney" / "losses.py"]
    return set().union(*(error_types(path) for path in paths))


def error_types(path: Path) -> set[str]:
    """The `type` of each whitney.errors class `path` calls and of each error-body literal."""
    found = literal_error_types(path)
    for node in ast.walk(module(path)):
        if isinstance(node, ast.Call):
            cls = getattr(errors, called_name(node.func) or "", None)
            if isinstance(cls, type) and issubclass(cls, errors.WhitneyError):
                found.add(cls.type)
    return found


def literal_error_types(path: Path) -> set[str]:
    """The `type` of each error-body literal `{"type": ..., "message": ..., ...}` in `path`."""
    found = set()
    for node in ast.walk(module(path)):
        if not isinstance(node, ast.Dict):
            continue
        fields = {
            key.value: value
            for key, value in zip(node.keys, node.values, strict=True)
            if isinstance(key, ast.Constant)
        }
        kind = fields.get("type")
        if "message" in fields and isinstance(kind, ast.Constant) and isinstance(kind.value, str):
            found.add(kind.value)
    return found


def test_every_error_type_the_server_can_answer_is_documented():
    types = server_error_types()
    assert {"seq_gap", "cancelled", "unsupported_base_model"} <= types  # the scan works
    missing = sorted(t for t in types if f"`{t}`" not in API)
    assert not missing


def test_the_error_table_gives_the_servers_status_for_each_type():
    rows = table(API, "| status | type | when | retry? |")
    documented = {row[1].strip("`"): int(row[0]) for row in rows}
    assert documented == {cls.type: cls.status for cls in errors.ERRORS_BY_TYPE.values()}
    for cls in (errors.TransportError, errors.OperationFailed, errors.OperationTimeout):
        assert f"`{cls.type}`" in section(API, "## Errors")


def test_the_operation_error_table_names_real_types():
    rows = table(API, "| `error.type` | when |")
    documented = {name for row in rows for name in TICKED.findall(row[0])}
    assert documented <= server_error_types()
    # the types the executor and the journal record, as an operation's error
    recorded = error_types(LOCAL / "executor.py") | error_types(LOCAL / "journal.py")
    assert recorded <= documented


def test_every_operation_kind_has_a_section():
    kinds = set(re.findall(r"^#### `(\w+)`$", API, re.M))
    assert kinds == wire.RUN_OPERATION_KINDS | wire.SAMPLER_OPERATION_KINDS
    under_run = set(re.findall(r"^#### `(\w+)`$", section(API, "### Run operations"), re.M))
    assert under_run == wire.RUN_OPERATION_KINDS


def test_the_run_object_lists_the_fields_the_server_answers():
    returned = next(
        node.value
        for node in ast.walk(function(LOCAL / "journal.py", "run_out"))
        if isinstance(node, ast.Return)
    )
    fields = [key.value for key in returned.keys]
    rows = table(section(API, "#### The Run object"), "| field | meaning | tag |")
    assert [row[0].strip("`") for row in rows] == fields


def test_the_operation_object_lists_the_fields_the_server_answers():
    path = LOCAL / "journal.py"
    source = ast.get_source_segment(path.read_text(), function(path, "render_operation"))
    fields = re.findall(r'"(\w+)":', source or "")
    assert fields[:2] == ["run_id", "seq_id"]
    rows = table(section(API, "#### The Operation object"), "| field | meaning | tag |")
    assert [row[0].strip("`") for row in rows] == fields


def test_the_optimizer_defaults_are_the_wire_and_engine_defaults():
    rows = table(section(API, "### Optimizer"), "| field | default | constraint |")
    documented = {row[0].strip("`"): row[1].strip("`") for row in rows}
    assert set(documented) == set(wire.Optimizer.model_fields)
    engine = constant(ENGINE / "validation.py", "OPTIMIZER_DEFAULTS")
    for name, value in documented.items():
        default = wire.Optimizer.model_fields[name].default
        if name == "type":
            assert value == default
        else:
            assert float(value) == default == engine[name], name


def test_the_server_constants_are_the_codes():
    rows = table(API, "| constant | value | meaning |")
    sources = [
        LOCAL / name
        for name in ("config.py", "operations.py", "runs.py", "workers.py", "executor.py")
    ]
    assert rows
    for name_cell, value, _ in rows:
        name = name_cell.strip("`")
        found = [constant(p, name) for p in sources if assigns(p, name)]
        assert found == [float(value)], name


def test_what_api_md_says_the_engine_declares():
    engine_files = sorted(ENGINE.glob("*.py"))
    batches = any(assigns(p, "SAMPLE_BATCH_INVARIANT") for p in engine_files)
    assert ("(the current engine does)" in flat(API)) == batches
    own_rank = any(assigns(p, "MAX_LORA_RANK") for p in engine_files)
    assert ("(the engine declares no other)" in API) == (not own_rank)
    capabilities = section(API, "### `GET /v1/training/capabilities`")
    for base_model in constant(ENGINE / "runtime.py", "BASE_MODELS"):
        assert f"`{base_model}`" in capabilities


def test_the_api_provider_table_is_the_sdks():
    rows = table(
        section(API, "## Providers"),
        "| provider | losses | `loss_config` keys | per-token clip tensors | critic runs |",
    )
    for row in rows:
        provider = row[0].strip("`")
        served = (
            set(TICKED.findall(row[1])) if row[1] != "all eight" else set(losses.LOSS_FUNCTIONS)
        )
        assert served == losses.PROVIDER_LOSS_SUPPORT[provider], provider
        assert row[3].startswith("accepted") == (provider in losses.PER_TOKEN_CLIP_PROVIDERS)
    assert sorted(row[0].strip("`") for row in rows) == sorted(PROVIDERS)
