"""The `export` command of `whitney-flows`: a run's adapter as Hugging Face model directories,
with the manifest of what made it (flows.core.records.manifest), and the check of that manifest.

    whitney-flows export RUN_ID --out DIR [--merged] [--manifest FILE]
                         [--api-url URL | --data-dir DIR]
    whitney-flows export --verify DIR

DIR/manifest.json is the flow's manifest of the run (`--manifest`, else the one `whitney-flows
run` wrote as adapters/RUN_ID-manifest.json, if there is one) with the sha256 of every file
written and of the base weights in DIR/base_model; without a flow manifest it says so and
holds what the run alone tells. `--verify` re-hashes what the manifest lists and prints one
line per item: ok, changed or not checkable; exit 1 if something changed (a file added to
DIR too) or nothing could be re-hashed, 2 without a readable manifest.

The endpoint resolves as for `inspect` (flows.cli.commands): `--api-url`, else WHITNEY_API_URL with
the key from WHITNEY_API_KEY, else an embedded server's data directory. The archive is the run's
latest `export_lora` of its current weights (the one a flow's normal end makes); a run with none
that is still active on a Whitney URL is asked for one. flows.core.records.hf_export writes DIR from
the
archive alone, offline; it needs the `hf` extra. No Prefect import: the command starts fast.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows.cli.commands import journal_source
from flows.cli.exit_codes import EXIT_BAD_CONFIG, EXIT_CHANGED, EXIT_OK, EXIT_UNVERIFIED
from flows.core.records.manifest import (
    MANIFEST_NAME,
    export_manifest,
    manifest_path,
    read_manifest,
    verify,
    with_files,
    write_manifest,
)
from whitney.hf_cache import file_sha256

HF_EXTRA = 'the export needs the hf extra: pip install -e ".[hf]"'
WEIGHT_KINDS = frozenset({"optim_step", "load_state"})
"""Operations after which an earlier export no longer holds the run's weights."""


class ExportError(Exception):
    """Why the export cannot be made, in one line for the user."""


def run_export(options: argparse.Namespace) -> int:
    """`export`, or `export --verify`; the exit code."""
    if options.verify is not None:
        return run_verify(options.verify)
    try:
        if options.run_id is None:
            raise ExportError("RUN_ID: give the run to export (or --verify DIR)")
        check_out_dir(options.out)
        manifest = flow_manifest(options.run_id, options.manifest)
        hf_export = import_hf_export()
        source = open_source(options)
        with quiet_client(source), tempfile.TemporaryDirectory(prefix="whitney-") as scratch:
            archive, exported = fetch_archive(source, options.run_id, Path(scratch))
            check_archive(archive, exported, manifest)
            write_atomically(options.out, options.merged, archive, hf_export, manifest)
    except ExportError as error:
        print(f"whitney-flows export: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    print(loaded_by(options.run_id, options.out, options.merged))
    return EXIT_OK


def run_verify(path: Path) -> int:
    """`export --verify`: one line per item of the manifest; 1 if something changed or
    nothing could be re-hashed, 2 if there is no manifest to read."""
    try:
        checks = verify(path)
    except ValueError as error:
        print(f"whitney-flows export: --verify: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    for item, status, detail in checks:
        print(f"{status:<13} {item}: {detail}")
    changed = sum(status == "changed" for _, status, _ in checks)
    print(f"{len(checks)} items, {changed} changed")
    if changed:
        return EXIT_CHANGED
    if not any(status == "ok" for _, status, _ in checks):
        print(
            f"whitney-flows export: --verify: nothing {path} lists could be re-hashed here: "
            "not verified",
            file=sys.stderr,
        )
        return EXIT_UNVERIFIED
    return EXIT_OK


def flow_manifest(run_id: str, given: Path | None) -> dict[str, Any]:
    """The export's manifest, from the flow's (`given`, else adapters/RUN_ID-manifest.json
    if it is there); ExportError if a given one cannot be read or is of another run."""
    path = given or manifest_path(run_id, Path("adapters"))
    if given is None and not path.is_file():
        return export_manifest(run_id, None, f"none found (looked for {path})")
    try:
        manifest = read_manifest(path)
    except ValueError as error:
        raise ExportError(f"--manifest: {error}") from None
    if manifest.get("run_id") != run_id:
        raise ExportError(f"--manifest {path} is of run {manifest.get('run_id')}, not {run_id}")
    return export_manifest(run_id, manifest, str(path.resolve()))


def check_out_dir(out: Path) -> None:
    """ExportError unless `out` is missing or an empty directory."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        raise ExportError(f"--out {out} is not empty: give a new or empty directory")


def import_hf_export() -> Any:
    """flows.core.records.hf_export, with transformers quiet (no progress bars, errors only);
    ExportError
    naming the `hf` extra if its packages are missing."""
    try:
        import peft  # noqa: F401
        import transformers
    except ImportError:
        raise ExportError(HF_EXTRA) from None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    from flows.core.records import hf_export

    return hf_export


def open_source(options: argparse.Namespace) -> Any:
    """The run's endpoint, as `inspect` resolves it; ExportError saying what is missing."""
    try:
        return journal_source(options)
    except ValueError as error:
        raise ExportError(str(error)) from None


@contextlib.contextmanager
def quiet_client(source: Any) -> Iterator[None]:
    """While the export runs, the client's retries are not logged (a failure is one line in
    the end); then its connections are closed."""
    logger = logging.getLogger("whitney.client")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
        client = getattr(source, "client", None)
        if client is not None:
            client.close()


def fetch_archive(source: Any, run_id: str, scratch: Path) -> tuple[Path, dict[str, Any]]:
    """The run's current export archive, and the export_lora result that made it: downloaded
    into `scratch` from a Whitney URL (made first if an active run has none), or the file in
    an embedded server's data directory."""
    from flows.core.records.inspection_sources import DataDirJournal, RunNotFound
    from whitney.errors import NotFound, TransportError, WhitneyError

    client = getattr(source, "client", None)
    where = client.base_url if client is not None else str(source.path.parent)
    try:
        run = source.run(run_id)
    except (RunNotFound, NotFound):
        raise ExportError(f"no run {run_id} at {where}") from None
    except TransportError as error:
        raise ExportError(
            f"cannot reach Whitney at {where} ({error.details['exception']})"
        ) from None
    except WhitneyError as error:
        raise ExportError(f"{where}: {error}") from None
    try:
        exported = current_export(source.operations(run_id))
        if isinstance(source, DataDirJournal):
            return data_dir_archive(source, run_id, exported)
        if exported is None:
            exported = export_now(client, run)
        archive = client.download_artifact(exported["artifact_id"], scratch / "adapter.tar")
        return archive, exported
    except WhitneyError as error:
        raise ExportError(f"run {run_id} at {where}: {error}") from None


def current_export(operations: list[Any]) -> dict[str, Any] | None:
    """The result (artifact id, sha256) of the latest succeeded export_lora that no later
    weight change (an optim_step, a load_state) has made stale; None if there is none."""
    exported = None
    for operation in operations:
        if operation.status != "succeeded":
            continue
        if operation.kind == "export_lora":
            exported = dict(operation.result or {})
        elif operation.kind in WEIGHT_KINDS:
            exported = None
    return exported


def data_dir_archive(
    source: Any, run_id: str, exported: dict[str, Any] | None
) -> tuple[Path, dict[str, Any]]:
    """The archive file of the export in the data directory, and the export's result;
    ExportError if there is none."""
    if exported is None:
        raise ExportError(f"run {run_id} has no export_lora of its current weights")
    artifact_id = exported.get("artifact_id")
    archive = source.artifact_file(artifact_id)
    if archive is None:
        raise ExportError(f"the archive of {artifact_id} (run {run_id}) is gone")
    return archive, exported


def export_now(client: Any, run: Any) -> dict[str, Any]:
    """Ask an active run for export_lora; its result. ExportError if the run has ended."""
    if run.status != "ready":
        raise ExportError(
            f"run {run.run_id} is {run.status} and has no export_lora of its current weights"
        )
    return dict(client.run_operation(run.run_id, "export_lora", {}))


def check_archive(archive: Path, exported: dict[str, Any], manifest: dict[str, Any]) -> None:
    """ExportError unless the archive's sha256 is the one its export_lora gave and, with a
    flow manifest, the adapter's that manifest records."""
    actual = file_sha256(archive)
    if actual != exported.get("sha256"):
        raise ExportError(
            f"the archive of {exported.get('artifact_id')} has sha256 {actual}, its "
            f"export_lora gave {exported.get('sha256')}"
        )
    recorded = (manifest.get("adapter") or {}).get("sha256")
    if recorded is not None and recorded != actual:
        raise ExportError(
            f"--manifest {manifest['flow_manifest']} records the adapter sha256 {recorded}, "
            f"not the run's current export ({actual})"
        )


def write_atomically(
    out: Path, merged: bool, archive: Path, hf_export: Any, manifest: dict[str, Any]
) -> None:
    """Write the directory beside `out`, with `manifest` and the sha256 of every file in it,
    then move it there: `out` appears complete or not at all."""
    out = out.absolute()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".partial"))
    except OSError as error:
        raise ExportError(f"cannot write --out {out}: {error.strerror or error}") from None
    try:
        if merged:
            hf_export.write_merged_dir(archive, staging)
        else:
            hf_export.write_peft_dir(archive, staging, home=out)
        write_manifest(with_files(manifest, staging), staging / MANIFEST_NAME)
        os.chmod(staging, 0o755)
        os.replace(staging, out)
    except hf_export.ArchiveError as error:
        raise ExportError(str(error)) from None
    except OSError as error:
        raise ExportError(f"cannot write --out {out}: {error.strerror or error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def loaded_by(run_id: str, out: Path, merged: bool) -> str:
    """The success line: what was written and how to load it."""
    if merged:
        return (
            f'Merged model of run {run_id} in {out}: AutoModelForCausalLM.from_pretrained("{out}")'
        )
    return (
        f"PEFT adapter of run {run_id} in {out} (its base model in {out / 'base_model'}): "
        f'AutoPeftModelForCausalLM.from_pretrained("{out}")'
    )
