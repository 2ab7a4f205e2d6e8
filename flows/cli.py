"""`whitney-flows`: run a training flow, or serve the embedded Whitney server.

    whitney-flows run rl [--config FILE.toml|.json] [--cycles N] [--env E] [--loss L] ...
    whitney-flows serve [--port P] [--api-key KEY] ...

`serve` goes straight to `whitney.local.cli.main` without importing Prefect (fast start).
Exit codes: 0 success, 1 the flow failed, 2 bad arguments or configuration.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

EXIT_OK = 0
EXIT_FLOW_FAILED = 1
EXIT_BAD_CONFIG = 2

PREFECT_ENV_DEFAULTS = {
    "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
}
"""Set unless the user set them: the progress bar replaces Prefect's per-task console lines
(the Prefect API still gets every log), and the ephemeral server does not phone home."""


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
    rl = flows.add_parser("rl", help="RL: group sampling, rewards, advantages, build_loss")
    rl.add_argument("--config", type=Path, metavar="FILE", help="RLConfig as .toml or .json")
    rl.add_argument("--cycles", type=int, metavar="N", help="number of cycles")
    rl.add_argument("--env", metavar="E", help="environment: digits, lowercase or module:attr")
    rl.add_argument("--loss", metavar="L", help="loss function (its build_loss recipe)")
    rl.add_argument("--provider", metavar="P", help="local, modal or tinker")
    rl.add_argument("--base-model", metavar="M", help="base model, e.g. local/tiny")
    rl.add_argument("--seed", type=int, metavar="S", help="seed of run, prompts and sampling")
    rl.add_argument(
        "--api-url",
        metavar="URL",
        help="Whitney URL (default: $WHITNEY_API_URL; neither: start the embedded server); "
        "the key comes from $WHITNEY_API_KEY",
    )
    rl.add_argument("--metrics-out", type=Path, metavar="FILE", help="metrics JSON lines")
    rl.add_argument(
        "--adapter-dir",
        type=Path,
        default=Path("adapters"),
        metavar="DIR",
        help="where the exported adapter is downloaded (default: ./adapters)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """The console script; returns the exit code."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == ["serve"]:
        from whitney.local.cli import main as serve

        return serve(arguments[1:])
    options = build_parser().parse_args(arguments)
    for name, value in PREFECT_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    from flows.run_rl import run_rl  # imports Prefect, which reads the variables above

    return run_rl(options)


if __name__ == "__main__":
    sys.exit(main())
