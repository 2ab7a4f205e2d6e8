"""The manifest of an adapter: what made it, written beside it as JSON, and its check.

    flow_manifest(...)       at a training flow's normal end: the flow, its Whitney run, the
                             config, the data files' sha256, the code version, the seq-id
                             range, the evaluations, the lineage (flows.core.records.lineage)
    with_files(m, dir)       the sha256 of every file of an exported directory (the adapter,
                             the base weights in base_model/) added to a manifest
    with_archive(m, path)    the downloaded adapter archive's sha256 added to a flow's
                             manifest, once it is the server's export_lora sha256
    verify(path)             per item: ok, changed or not checkable

A manifest is not signed: `verify` shows that what it lists is unchanged since it was
written (integrity), not who wrote it (origin).

`whitney-flows run` writes the flow's manifest beside the downloaded archive
(`{run_id}-manifest.json`); `whitney-flows export` writes `manifest.json` in its directory;
`promote-checkpoint` adds its approval to that one. No Prefect, no torch: the export command
imports this.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from whitney import hf_cache
from whitney.hf_cache import file_sha256
from whitney.tokenizers import HF_PREFIX, LOCAL_PREFIX

MANIFEST_NAME = "manifest.json"
"""The manifest's name in an exported directory."""
MANIFEST_VERSION = 1
PACKAGE = "whitney-flows"
RUN_LOCAL_FIELDS = frozenset({"api_url", "metrics_path"})
"""Config fields that say where a run ran, not how it trained: no data file among them."""
Status = Literal["ok", "changed", "not checkable"]
SHA256 = re.compile(r"[0-9a-f]{64}")


def manifest_path(run_id: str, directory: Path) -> Path:
    """Where `whitney-flows run` writes a flow's manifest beside `archive_path`."""
    return directory / f"{run_id}-manifest.json"


def archive_path(run_id: str, directory: Path) -> Path:
    """Where `whitney-flows run` downloads a run's exported adapter archive."""
    return directory / f"{run_id}-adapter.tar"


def code_version(root: Path | None = None) -> dict[str, Any]:
    """The code that ran: the git commit of the checkout holding this package and whether its
    tree differed from it (uncommitted changes or untracked files, ignored ones aside); the
    installed package version when it is not a checkout."""
    root = root or Path(__file__).resolve().parents[3]
    try:
        commit = git(root, "rev-parse", "HEAD")
        dirty = bool(git(root, "status", "--porcelain"))
    except (OSError, subprocess.CalledProcessError):
        try:
            version: str | None = importlib.metadata.version(PACKAGE)
        except importlib.metadata.PackageNotFoundError:
            version = None
        return {"git_commit": None, "dirty": None, "package_version": version}
    return {"git_commit": commit, "dirty": dirty, "package_version": None}


def git(root: Path, *arguments: str) -> str:
    """The output of `git -C root ARGUMENTS`, stripped."""
    completed = subprocess.run(
        ["git", "-C", str(root), *arguments],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return completed.stdout.strip()


def data_files(config: Mapping[str, Any], extra: Iterable[Path] = ()) -> dict[str, dict[str, Any]]:
    """The files a config names (any string setting, at any depth, that is an existing file:
    SFT data, an environment's data) and `extra` ones (an environment's packaged data), each
    with its sha256, by its field (dotted) or its path."""
    found: dict[str, dict[str, Any]] = {}
    for field, value in flat_settings(config).items():
        if field in RUN_LOCAL_FIELDS or not isinstance(value, str) or "\n" in value:
            continue
        path = Path(value).expanduser()
        if len(value) < 4096 and path.is_file():
            found[field] = {"path": str(path.resolve()), "sha256": file_sha256(path)}
    for path in extra:
        found[str(path)] = {"path": str(path.resolve()), "sha256": file_sha256(path)}
    return found


def flat_settings(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as {dotted field: value}."""
    flat: dict[str, Any] = {}
    for name, value in config.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping):
            flat.update(flat_settings(value, f"{key}."))
        else:
            flat[key] = value
    return flat


def base_weights(name: str) -> dict[str, Any]:
    """The sha256 of a base model's weights where they are on this machine: the `*.safetensors`
    of a Hugging Face repo id's snapshot in the local cache or of an `hf:<dir>` directory (by
    path; `sha256` over their digests in name order), with `sha256_of` saying what was hashed."""
    if name.startswith(LOCAL_PREFIX):
        return {
            "sha256": None,
            "sha256_of": "none: a local/* model's base weights are built by the engine, no "
            "file; an export carries them (base_model/model.safetensors)",
        }
    bare = name.removeprefix(HF_PREFIX)
    directory = Path(bare).expanduser()
    if not directory.is_dir():
        directory = (hf_cache.snapshot(bare) if hf_cache.is_repo_id(bare) else None) or directory
    weights = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    if not weights:
        return {"sha256": None, "sha256_of": f"none: no weights of {name} on this machine"}
    files = {str(path.resolve()): file_sha256(path) for path in weights}
    combined = hashlib.sha256("\n".join(files.values()).encode("ascii")).hexdigest()
    return {
        "sha256": files[str(weights[0].resolve())] if len(files) == 1 else combined,
        "sha256_of": f"the *.safetensors of {directory}"
        + ("" if len(files) == 1 else " (sha256 of their sha256s, one a line, in name order)"),
        "files": files,
    }


def evaluations(cycles: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Every evaluation the cycles recorded (`eval`, `eval_before`, SFT's `evals`), by cycle."""
    found = []
    for cycle in cycles:
        numbers = {
            key: value
            for key, value in cycle.items()
            if key.startswith("eval") and value not in (None, {}, [])
        }
        if numbers:
            found.append({"cycle": cycle.get("cycle"), **numbers})
    return found


def flow_manifest(
    *,
    flow: str,
    config: Mapping[str, Any],
    run: Mapping[str, Any],
    seq_ids: tuple[int, int],
    cycles: Iterable[Mapping[str, Any]],
    lineage: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """A training flow's manifest at its normal end. `run`: session_id, run_id, checkpoint,
    adapter (the export_lora result); `seq_ids`: the run's first and last seq id this flow
    run made; `cycles`: every cycle's metrics (as JSON)."""
    settings = {name: value for name, value in config.items() if name not in RUN_LOCAL_FIELDS}
    return {
        "manifest_version": MANIFEST_VERSION,
        "flow": flow,
        "run_id": run["run_id"],
        "session_id": run["session_id"],
        "checkpoint": run["checkpoint"],
        "adapter": dict(run["adapter"]),
        "base_model": {
            "name": config.get("base_model"),
            "provider": config.get("provider"),
            "lora_rank": config.get("lora_rank"),
            **base_weights(str(config.get("base_model"))),
        },
        "config": settings,
        "data_files": data_files(settings),
        "code": code_version(),
        "seq_ids": {"first": seq_ids[0], "last": seq_ids[1]},
        "evaluations": evaluations(cycles),
        "lineage": dict(lineage) if lineage is not None else None,
        "promotion": None,
        "files": {},
    }


def export_manifest(run_id: str, flow: Mapping[str, Any] | None, source: str) -> dict[str, Any]:
    """The manifest of `whitney-flows export`: the flow's (`flow`, read from `source`) or, with
    none found, what the run alone says (`source` says why there is no config)."""
    if flow is not None:
        return {**flow, "flow_manifest": source}
    return {
        "manifest_version": MANIFEST_VERSION,
        "flow": None,
        "run_id": run_id,
        "config": None,
        "data_files": {},
        "code": code_version(),
        "lineage": None,
        "promotion": None,
        "files": {},
        "flow_manifest": source,
    }


def with_files(manifest: Mapping[str, Any], directory: Path) -> dict[str, Any]:
    """`manifest` with the sha256 of every file under `directory` (but the manifest), and the
    base weights' sha256 when the directory holds them (`base_model/model.safetensors`)."""
    files = {name: file_sha256(directory / name) for name in directory_files(directory)}
    base = dict(manifest.get("base_model") or {})
    carried = "base_model/model.safetensors"
    if carried in files:
        base["exported_sha256"] = files[carried]
        if not base.get("sha256"):
            base.update(
                sha256=files[carried], sha256_of=f"the base weights the export carries ({carried})"
            )
    elif (directory / "model.safetensors").is_file():
        base["exported_sha256"] = None  # the merged model: base and adapter in one
    return {**manifest, "base_model": base, "files": files}


def with_archive(manifest: Mapping[str, Any], archive: Path) -> dict[str, Any]:
    """A flow's manifest with the sha256 of its adapter archive downloaded beside it;
    ValueError if that is not the sha256 the server's export_lora gave (`adapter.sha256`)."""
    actual = file_sha256(archive)
    expected = (manifest.get("adapter") or {}).get("sha256")
    if actual != expected:
        raise ValueError(
            f"the downloaded {archive} has sha256 {actual}, the server's export_lora gave "
            f"{expected}: download it again"
        )
    return {**manifest, "files": {archive.name: actual}}


def write_manifest(manifest: Mapping[str, Any], path: Path) -> Path:
    """The manifest as indented JSON at `path`."""
    path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest at `path`, or `path`/manifest.json; ValueError saying what is wrong."""
    if path.is_dir():
        path = path / MANIFEST_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"cannot read {path}: {error.strerror or error}") from None
    except json.JSONDecodeError as error:
        raise ValueError(f"{path} is not JSON: {error}") from None
    if not isinstance(data, dict) or "manifest_version" not in data:
        raise ValueError(f"{path} is not a whitney-flows manifest")
    return data


def add_promotion(directory: Path, promotion: Mapping[str, Any]) -> None:
    """Record a promotion's approval in the manifest of an exported directory."""
    path = directory / MANIFEST_NAME
    write_manifest({**read_manifest(path), "promotion": dict(promotion)}, path)


def verify(path: Path) -> list[tuple[str, Status, str]]:
    """Re-check what the manifest at `path` (a file, or a directory's manifest.json) hashed:
    its files (beside it; in an export directory, every file, so one it does not list is
    changed too), the adapter archive against the server's export_lora sha256, its data files
    and the base weights; (item, status, detail) each. ValueError naming a field the
    manifest lacks or holds in another shape."""
    manifest = read_manifest(path)
    where = path / MANIFEST_NAME if path.is_dir() else path
    home = where.parent
    files = hashes(manifest.get("files"), f"{where}: files")
    checks = [
        check_file(f"file {name}", home / name, sha, missing="changed")
        for name, sha in files.items()
    ]
    if where.name == MANIFEST_NAME:
        listed = set(files)
        checks += [
            (f"file {name}", "changed", "added: the manifest does not list it")
            for name in directory_files(home)
            if name not in listed
        ]
    archive = archive_path(str(manifest.get("run_id")), home)
    server_sha256 = (manifest.get("adapter") or {}).get("sha256")
    if archive.name in files and server_sha256:
        item = f"adapter {archive.name} as the server's export_lora"
        checks.append(check_file(item, archive, server_sha256, missing="changed"))
    for field, entry in entries(manifest.get("data_files"), f"{where}: data_files").items():
        checks.append(check_file(f"data {field}", Path(entry["path"]), entry["sha256"]))
    base = manifest.get("base_model") or {}
    weights = hashes(base.get("files") or {}, f"{where}: base_model.files", inside=False)
    for file, sha in weights.items():
        checks.append(check_file(f"base model {base.get('name')}", Path(file), sha))
    if not base.get("sha256"):
        reason = base.get("sha256_of") or "no base weights were hashed"
        checks.append((f"base model {base.get('name')}", "not checkable", reason))
    return checks


def hashes(value: Any, field: str, inside: bool = True) -> dict[str, str]:
    """`value` as a table of file -> sha256; ValueError naming `field` if it is not one (with
    `inside`, of relative paths that stay in the manifest's directory)."""
    if not isinstance(value, dict):
        raise ValueError(f"{field}: missing, or not a table of file -> sha256")
    for name, sha in value.items():
        if not isinstance(sha, str) or not SHA256.fullmatch(sha):
            raise ValueError(f"{field}: {name}: {sha!r} is not a sha256")
        parts = PurePosixPath(name).parts
        if inside and (PurePosixPath(name).is_absolute() or ".." in parts or not parts):
            raise ValueError(f"{field}: {name!r} is not a path inside the manifest's directory")
    return value


def entries(value: Any, field: str) -> dict[str, dict[str, str]]:
    """`value` as the data files' table (field -> {path, sha256}); ValueError naming `field`
    if it is not one (a missing table is an empty one)."""
    value = {} if value is None else value
    if not isinstance(value, dict):
        raise ValueError(f"{field}: not a table of setting -> {{path, sha256}}")
    for name, entry in value.items():
        if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
            raise ValueError(f"{field}: {name}: not a {{path, sha256}} table")
        hashes({entry["path"]: entry.get("sha256")}, f"{field}.{name}", inside=False)
    return value


def directory_files(home: Path) -> list[str]:
    """Every file under an export directory but its manifest, as `files` names them."""
    return [
        path.relative_to(home).as_posix()
        for path in sorted(home.rglob("*"))
        if path.is_file() and path.relative_to(home).as_posix() != MANIFEST_NAME
    ]


def check_file(
    item: str, path: Path, expected: str, missing: Status = "not checkable"
) -> tuple[str, Status, str]:
    """Whether the file at `path` still has the sha256 `expected` (`missing`: the status when
    it is not there: changed for the files beside the manifest)."""
    if not path.is_file():
        return item, missing, f"{path} is not there"
    actual = file_sha256(path)
    if actual != expected:
        return item, "changed", f"sha256 {actual}, recorded {expected}"
    return item, "ok", expected
