"""`whitney-flows fork`: a new flow run from a run's `cycle-{k}` checkpoint, with changed settings.

    whitney-flows fork PARENT --cycle K [--set FIELD=VALUE ...] [--api-url URL] ...

PARENT is the parent's manifest (flows.core.records.manifest): a file, a directory holding
`manifest.json` (an export), or a Whitney run id, whose manifest `whitney-flows run` wrote
beside its adapter (`--adapter-dir`/RUN-manifest.json). The fork's config is the parent's
with the `--set` fields on top (flows.cli.settings: VALUE is JSON when it parses as JSON,
else a string; a dotted FIELD sets a nested one) and `resume_from` the parent's checkpoint
after cycle K; it runs as `whitney-flows run FLOW --config` would (flows.cli.run), and
records its lineage (flows.core.records.lineage). Refused, exit 2 with one line naming the field: a
cycle the parent has no checkpoint of, a field its flow's config does not have (with the
nearest valid name), one a fork cannot change.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flows.cli.commands import journal_source
from flows.cli.exit_codes import EXIT_BAD_CONFIG
from flows.core.config import ConfigError
from flows.core.records.manifest import manifest_path, read_manifest
from tasks.names import CYCLE_CHECKPOINT

if TYPE_CHECKING:
    from flows.catalogue import TrainingFlow

PROG = "whitney-flows fork"
SET_BY_FORK = ("resume_from", "api_url", "metrics_path")
"""Fields `--set` may not name: the fork sets them (--cycle, --api-url, --metrics-out)."""


def run_fork(options: argparse.Namespace) -> int:
    """`fork`; the exit code."""
    from flows.catalogue import by_name  # the flows' configs: only for a fork

    try:
        manifest = parent_manifest(options.parent, options.adapter_dir)
        flow = by_name(manifest.get("flow"))
        if flow is None or not isinstance(manifest.get("config"), dict):
            raise ConfigError("PARENT", f"{options.parent}: its manifest names no training flow")
        check_fork_fields(flow, options.set or [], manifest["config"])
        checkpoint = parent_checkpoint(options, manifest["run_id"], options.cycle)
        config = fork_config(flow, manifest["config"], options.set or [], checkpoint)
    except ConfigError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    with tempfile.TemporaryDirectory(prefix="whitney-fork-") as scratch:
        path = Path(scratch) / "config.json"
        path.write_text(json.dumps(config), encoding="utf-8")
        arguments = ["run", flow.command, "--config", str(path)]
        arguments += ["--adapter-dir", str(options.adapter_dir)]
        if options.api_url:
            arguments += ["--api-url", options.api_url]
        if options.metrics_out:
            arguments += ["--metrics-out", str(options.metrics_out)]
        from flows.cli.parsers import build_parser
        from flows.cli.run import run_flow  # imports Prefect

        return run_flow(build_parser().parse_args(arguments), PROG)


def parent_manifest(parent: str, adapter_dir: Path) -> dict[str, Any]:
    """The manifest PARENT names (see the module docstring); ConfigError if there is none."""
    path = Path(parent)
    if not path.exists():
        path = manifest_path(parent, adapter_dir)
        if not path.is_file():
            raise ConfigError(
                "PARENT", f"{parent} is no manifest, directory, or run with a manifest at {path}"
            )
    try:
        return read_manifest(path)
    except ValueError as error:
        raise ConfigError("PARENT", str(error)) from None


def parent_checkpoint(options: argparse.Namespace, run_id: str, cycle: int) -> str:
    """The parent run's checkpoint after `cycle`, from its journal (at --api-url, else
    WHITNEY_API_URL, else in the data directory of the embedded server the fork will start);
    ConfigError naming --cycle, with the cycles it has, if it saved none then."""
    from flows.core.records.inspection_sources import RunNotFound
    from whitney.errors import WhitneyError

    source_options = argparse.Namespace(api_url=options.api_url, data_dir=None)
    try:
        source = journal_source(source_options)
    except ValueError as error:
        raise ConfigError("--api-url", str(error)) from None
    try:
        operations = source.operations(run_id)
    except (RunNotFound, WhitneyError) as error:
        raise ConfigError("PARENT", f"run {run_id}: {error}") from None
    finally:
        if (client := getattr(source, "client", None)) is not None:
            client.close()
    saved = {
        int(match["cycle"]): match[0]
        for operation in operations
        if operation.kind == "save_state" and operation.status == "succeeded"
        if (match := CYCLE_CHECKPOINT.match(str((operation.result or {}).get("checkpoint"))))
    }
    if cycle not in saved:
        have = sorted(saved)
        raise ConfigError(
            "--cycle",
            f"run {run_id} saved no checkpoint after cycle {cycle} (it has cycles "
            f"{', '.join(map(str, have)) or 'none'}; checkpoint_every sets them)",
        )
    return saved[cycle]


def fork_config(
    flow: TrainingFlow, parent: dict[str, Any], settings: list[str], checkpoint: str
) -> dict[str, Any]:
    """The parent's config with `settings` (FIELD=VALUE, flows.cli.settings) on top, resuming
    from `checkpoint`."""
    from flows.cli.settings import apply_settings

    config = apply_settings(flow.config, json.loads(json.dumps(parent)), settings)
    config["resume_from"] = checkpoint
    return config


def check_fork_fields(flow: TrainingFlow, settings: list[str], parent: dict[str, Any]) -> None:
    """ConfigError naming a `--set` field the flow's config does not have (and the nearest
    valid name), one the fork sets itself, or one a fork cannot change
    (flows.core.records.lineage.FIXED_IN_FORK)."""
    from flows.cli.settings import resolved_path, split_setting
    from flows.core.records.lineage import FIXED_IN_FORK
    from flows.core.records.manifest import flat_settings

    known = flat_settings(parent)
    for setting in settings:
        parts, _ = resolved_path(flow.config, split_setting(setting)[0])
        field = ".".join(parts)
        if field in SET_BY_FORK:
            raise ConfigError(
                f"--set {field}", "the fork sets it (--cycle, --api-url, --metrics-out)"
            )
        if field in FIXED_IN_FORK:
            raise ConfigError(
                f"--set {field}",
                "cannot change in a fork: the checkpoint's LoRA weights are of the parent's "
                f"{field} ({known.get(field)!r})",
            )
