"""`whitney-flows`: run a training flow, or serve the embedded Whitney server.

    whitney-flows run rl [--config FILE.toml|.json] [--cycles N] [--env E] [--loss L] ...
    whitney-flows run sft [--config FILE] [--steps N | --epochs N] [--data FILE.jsonl] ...
    whitney-flows run distill [--config FILE] [--cycles N] [--task-runner thread|dask] ...
    whitney-flows inspect RUN_ID [--cycle N] [--json]     (flows.cli.commands)
    whitney-flows runs [--json]
    whitney-flows export RUN_ID --out DIR [--merged]      (flows.cli.export)
    whitney-flows serve [--port P] [--api-key KEY] ...

`serve` goes straight to `whitney.local.cli.main` without importing Prefect (fast start), and
so do `inspect`, `runs` and `export`.
Exit codes: 0 success, 1 the flow failed (or stdout was closed early, never with a traceback),
2 bad arguments or configuration.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from flows.cli.commands import (
    ENV_HELP,
    LOSS_HELP,
    PROVIDER_HELP,
    add_distill_parser,
    add_inspection_parsers,
    config_help,
    run_inspection,
)
from flows.cli.exit_codes import EXIT_CLOSED_PIPE
from flows.cli.export import add_export_parser, run_export

PREFECT_ENV_DEFAULTS = {
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
}
"""Set unless the user set them: the progress bar replaces Prefect's per-task console lines
(the Prefect API still gets every log), the ephemeral server does not phone home, and the
Prefect client sends no usage data and prints no first-run telemetry notice."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="whitney-flows",
        description="Production LoRA training pipelines on Prefect for the Whitney API.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "serve", help="run the embedded Whitney server (see: whitney-flows serve --help)"
    )
    run = commands.add_parser("run", help="run a training flow")
    flows = run.add_subparsers(dest="flow", required=True, metavar="FLOW")
    rl = flows.add_parser(
        "rl",
        help="RL: group sampling, rewards, advantages, build_loss",
        formatter_class=config_help("flows.rl.config:RLConfig"),
    )
    rl.add_argument("--config", type=Path, metavar="FILE", help="RLConfig as .toml or .json")
    rl.add_argument("--cycles", type=int, metavar="N", help="number of cycles")
    rl.add_argument("--env", metavar="E", help=ENV_HELP)
    rl.add_argument("--loss", metavar="L", help=LOSS_HELP)
    rl.add_argument("--provider", metavar="P", help=PROVIDER_HELP)
    rl.add_argument("--base-model", metavar="M", help="base model")
    rl.add_argument("--seed", type=int, metavar="S", help="seed of run, prompts and sampling")
    add_output_options(rl)
    sft = flows.add_parser(
        "sft",
        help="SFT: (prompt, completion) pairs, cross_entropy, eval loss",
        formatter_class=config_help("flows.sft.config:SFTConfig"),
    )
    sft.add_argument("--config", type=Path, metavar="FILE", help="SFTConfig as .toml or .json")
    length = sft.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, metavar="N", help="optimizer steps in total")
    length.add_argument(
        "--epochs", type=int, metavar="N", help="passes over the training split, one cycle each"
    )
    sft.add_argument(
        "--data",
        type=Path,
        metavar="FILE.jsonl",
        help='one {"prompt": ..., "completion": ...} per line (default: the built-in corpus)',
    )
    sft.add_argument("--provider", metavar="P", help=PROVIDER_HELP)
    sft.add_argument("--base-model", metavar="M", help="base model")
    sft.add_argument("--lr", type=float, metavar="X", help="peak learning rate")
    sft.add_argument("--schedule", metavar="S", help="constant, linear or cosine (with warmup)")
    sft.add_argument("--seed", type=int, metavar="S", help="seed of the run and the data order")
    add_output_options(sft)
    add_output_options(add_distill_parser(flows))
    add_inspection_parsers(commands)
    add_export_parser(commands)
    return parser


def add_output_options(command: argparse.ArgumentParser) -> None:
    """--api-url, --metrics-out and --adapter-dir: the same for every `run FLOW`."""
    command.add_argument(
        "--api-url",
        metavar="URL",
        help="Whitney URL (default: $WHITNEY_API_URL; neither: start the embedded server); "
        "the key comes from $WHITNEY_API_KEY",
    )
    command.add_argument("--metrics-out", type=Path, metavar="FILE", help="metrics JSON lines")
    command.add_argument(
        "--adapter-dir",
        type=Path,
        default=Path("adapters"),
        metavar="DIR",
        help="where the exported adapter is downloaded (default: ./adapters)",
    )


def main(argv: list[str] | None = None) -> int:
    """The console script; returns the exit code."""
    try:
        code = run_command(list(sys.argv[1:] if argv is None else argv))
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:  # the reader of stdout has gone (`| head`): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nor at exit
        return EXIT_CLOSED_PIPE


def run_command(arguments: list[str]) -> int:
    """The command `arguments` name; its exit code."""
    if arguments[:1] == ["serve"]:
        from whitney.local.cli import main as serve

        return serve(arguments[1:])
    options = build_parser().parse_args(arguments)
    if options.command in ("inspect", "runs"):
        return run_inspection(options)
    if options.command == "export":
        return run_export(options)
    for name, value in PREFECT_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    if options.flow == "sft":
        from flows.cli.run_sft import run_sft  # imports Prefect, which reads the variables above

        return run_sft(options)
    if options.flow == "distill":
        from flows.cli.run_distill import run_distill  # imports Prefect, as above

        return run_distill(options)
    from flows.cli.run_rl import run_rl  # imports Prefect, which reads the variables above

    return run_rl(options)


if __name__ == "__main__":
    sys.exit(main())
