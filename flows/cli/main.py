"""`whitney-flows`: run a training flow, or serve the embedded Whitney server.

    whitney-flows run rl [--config FILE.toml|.json] [--cycles N] [--env E] [--loss L] ...
    whitney-flows run sft [--config FILE] [--steps N | --epochs N] [--data FILE.jsonl] ...
    whitney-flows run distill [--config FILE] [--cycles N] [--task-runner thread|dask] ...
    whitney-flows run dpo [--config FILE] [--data FILE.jsonl] [--reference base|URI] ...
    whitney-flows inspect RUN_ID [--cycle N] [--json]     (flows.cli.commands)
    whitney-flows runs [--json]
    whitney-flows export RUN_ID --out DIR [--merged]      (flows.cli.export)
    whitney-flows export --verify DIR                     (flows.core.records.manifest)
    whitney-flows fork PARENT --cycle K [--set F=V ...]   (flows.cli.fork)
    whitney-flows reap [--apply] [--json]                 (flows.cli.reap)
    whitney-flows sweep CONFIG [--block NAME] [--set F=V ...]  (flows.cli.sweep)
    whitney-flows models import FILE.gguf | pull NAME | list   (flows.cli.models)
    whitney-flows serve [--port P] [--api-key KEY] [--capture FILE] ...
    whitney-flows serve --tinker-block NAME ...          (flows.cli.tinker_block)
    whitney-flows chat MODEL [--api-url URL] [--system TEXT]   (flows.cli.chat)
    whitney-flows docs config [--out FILE]                (flows.cli.config_reference)

Every `run FLOW` also takes `--set FIELD=VALUE` for any field of its config (flows.cli.settings).

`serve` goes straight to `whitney.local.cli.main` without importing Prefect (fast start), and
so do `inspect`, `runs`, `export` and `chat`.
Exit codes: 0 success, 1 the flow failed (or stdout was closed early, never with a traceback),
2 bad arguments or configuration.
"""

from __future__ import annotations

import os
import sys
import warnings

from flows.cli import tinker_block
from flows.cli.chat import run_chat
from flows.cli.commands import run_inspection
from flows.cli.config_reference import write_reference
from flows.cli.exit_codes import EXIT_BAD_CONFIG, EXIT_CLOSED_PIPE
from flows.cli.export import run_export
from flows.cli.fork import run_fork
from flows.cli.models import run_models
from flows.cli.parsers import build_parser
from flows.cli.reap import run_reap
from flows.cli.sweep import run_sweep
from flows.core.config import ConfigError
from flows.core.orchestration.prefect_env import set_prefect_env_defaults
from flows.core.renames import RenamedSetting


def main(argv: list[str] | None = None) -> int:
    """The console script; returns the exit code."""
    warnings.showwarning = one_line_warning
    try:
        code = run_command(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:  # the reader of stdout has gone (`| head`): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor at exit
        return EXIT_CLOSED_PIPE


def one_line_warning(
    message: Warning | str, category: type[Warning], *args: object, **kwargs: object
) -> None:
    """A renamed setting's deprecation as one line on stderr; other warnings as Python shows
    them."""
    if issubclass(category, RenamedSetting):
        print(f"whitney-flows: {message}", file=sys.stderr)
    else:
        SHOW_WARNING(message, category, *args, **kwargs)  # type: ignore[arg-type]


SHOW_WARNING = warnings.showwarning


def run_command(arguments: list[str]) -> int:
    """The command `arguments` name; its exit code."""
    if arguments[:1] == ["serve"]:
        from whitney.local.cli import main as serve

        if tinker_block.names_block(arguments):  # the only serve that imports Prefect
            try:
                arguments = tinker_block.tinker_serve_arguments(arguments)
            except ConfigError as error:
                print(f"whitney-flows serve: {error}", file=sys.stderr)
                return EXIT_BAD_CONFIG
        return serve(arguments[1:])
    options = build_parser().parse_args(arguments)
    if options.command in ("inspect", "runs"):
        return run_inspection(options)
    if options.command == "export":
        return run_export(options)
    if options.command == "models":
        return run_models(options)
    if options.command == "chat":
        return run_chat(options)
    if options.command == "docs":
        return write_reference(options)
    if options.command == "sweep":
        return run_sweep(options)  # sets the Prefect defaults itself
    set_prefect_env_defaults()
    if options.command == "reap":
        return run_reap(options)
    if options.command == "fork":
        return run_fork(options)
    from flows.cli.run import run_flow  # imports Prefect

    return run_flow(options)


if __name__ == "__main__":
    sys.exit(main())
