"""`whitney-flows sweep CONFIG`: run the sweep flow here, its trials on the work pool of a
Prefect server (docs/sweeps.md).

    whitney-flows sweep sweep.toml [--block whitney] [--set FIELD=VALUE ...]

The config (.toml or .json, a SweepConfig, each `--set` on top: `--set max_concurrent=2`,
`--set base.learning_rate=0.01`; flows.cli.settings) and every trial's config are checked
first: a bad field is one line naming it, exit code 2, before anything runs. The trials are
flow runs of their deployment, so PREFECT_API_URL must name a Prefect server with the
deployments and a worker; none is exit code 2 too. The sweep's log lines (each rung, each
trial's result) show as it runs; at the end, the comparison table. Exit code 0, or 1 if the
sweep flow failed.
"""

from __future__ import annotations

import argparse
import os
import sys

from flows.cli.exit_codes import EXIT_BAD_CONFIG, EXIT_FLOW_FAILED, EXIT_OK
from flows.core.orchestration.prefect_env import set_prefect_env_defaults

PROG = "whitney-flows sweep"
CONSOLE_LEVEL = "PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL"


def run_sweep(options: argparse.Namespace) -> int:
    """`sweep`; the exit code."""
    os.environ.setdefault(CONSOLE_LEVEL, "INFO")  # the sweep's progress is its log
    set_prefect_env_defaults()
    from flows.cli.settings import apply_settings
    from flows.core.config import ConfigError, read_config_file, validated
    from flows.sweep.config import SweepConfig
    from flows.sweep.plan import check_sweep_config

    try:
        data = apply_settings(SweepConfig, read_config_file(options.config), options.set)
        config = validated(SweepConfig, data)
        trials = check_sweep_config(config)
        from prefect.settings import PREFECT_API_URL

        api_url = PREFECT_API_URL.value()
        if not api_url:
            raise ConfigError(
                "PREFECT_API_URL",
                "a sweep runs its trials on a work pool: set it to the Prefect server that "
                "has the deployments (docs/sweeps.md)",
            )
    except ConfigError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return EXIT_BAD_CONFIG
    print(
        f"{PROG}: {len(trials)} {config.kind} trials, rungs {config.rungs}, at most "
        f"{config.max_concurrent} at once, on {api_url}",
        flush=True,
    )
    from flows.cli.run import send_prefect_backlog
    from flows.sweep.comparison import comparison_markdown
    from flows.sweep.flow import sweep_flow

    state = sweep_flow(config, options.block, return_state=True)
    send_prefect_backlog()
    if not state.is_completed():
        print(f"{PROG}: the sweep ended {state.type.value}: {state.message}", file=sys.stderr)
        return EXIT_FLOW_FAILED
    text = comparison_markdown(state.result(), config.rungs)
    print(text.split("\n## Curves", 1)[0], flush=True)
    return EXIT_OK
