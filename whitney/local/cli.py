"""`whitney-flows serve` / `python -m whitney.local serve`: run the embedded Whitney server.

Start-up failures (a data directory a live server owns, port in use, unwritable data
directory, missing torch) print one line on stderr and exit 2, with no traceback.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sqlite3
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from whitney.hf_cache import cache_dir
from whitney.local.config import (
    API_KEYS_ENV,
    DEFAULT_GAP_TIMEOUT_S,
    DEFAULT_SESSION_TTL_S,
    ServerConfig,
    api_keys_from_env,
    api_keys_from_file,
    default_data_dir,
    generate_api_key,
)
from whitney.local.embedded import (
    ServerStartError,
    bind_socket,
    check_data_dir,
    check_dependencies,
    make_uvicorn,
)
from whitney.local.limits import LIMIT_HELP, Limits
from whitney.local.ownership import DataDirOwned

Number = TypeVar("Number", int, float)

PROG = "whitney-flows serve"
EXIT_START_FAILURE = 2


def _checked(
    name: str, convert: Callable[[str], Number], ok: Callable[[Number], bool], rule: str
) -> Callable[[str], Number]:
    """An argparse type named `name`: `convert`, refused unless `ok` ("must be `rule`")."""

    def parse(text: str) -> Number:
        value = convert(text)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {rule}, got {text}")
        return value

    parse.__name__ = name  # argparse names it when `convert` refuses the text
    return parse


_rate = _checked("_rate", float, lambda value: 0.0 <= value <= 1.0, "within [0, 1]")
_non_negative = _checked("_non_negative", float, lambda value: value >= 0, ">= 0")
_positive = _checked("_positive", float, lambda value: value > 0, "> 0")
_count = _checked("_count", int, lambda value: value >= 1, ">= 1")


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def wake_waiters_on_exit(server: Any, service: Any) -> None:
    """When uvicorn is told to stop (SIGINT, SIGTERM), wake every long-poll at once, so that
    each answers before uvicorn's graceful shutdown instead of being dropped after it."""
    handle_exit = server.handle_exit

    def exit_and_wake(sig: int, frame: Any) -> None:
        handle_exit(sig, frame)
        threading.Thread(target=service.wake_waiters, name="whitney-wake", daemon=True).start()

    server.handle_exit = exit_and_wake


def keys_from_file(path: Path | None) -> list[str]:
    """The keys of `--api-keys-file` (none without one); ServerStartError naming the flag."""
    if path is None:
        return []
    try:
        return api_keys_from_file(path)
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ServerStartError(f"--api-keys-file: cannot read {str(path)!r}: {reason}") from None
    except ValueError as exc:
        raise ServerStartError(f"--api-keys-file: {exc}") from None


def tinker_url(url: str | None) -> str | None:
    """`--tinker-url`, checked (ServerStartError naming the flag), or None."""
    if url is None:
        return None
    from whitney.local.tinker_endpoint import endpoint_of

    try:
        endpoint_of(url)
    except ValueError as exc:
        raise ServerStartError(f"--tinker-url: {exc}") from None
    return url


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run the embedded Whitney server: the Whitney training API on a local "
        "CPU engine that trains small LoRA models.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8765, help="port (0: a free one)")
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help=f"journal, checkpoints and artifacts (default: {default_data_dir()})",
    )
    parser.add_argument(
        "--api-keys-file",
        type=Path,
        metavar="FILE",
        help=f"accepted API keys, one a line, one tenant each; also ${API_KEYS_ENV} "
        "(comma-separated); with neither, a fresh key is generated and printed",
    )
    parser.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="an accepted API key (repeatable; for tests: other users of this machine see "
        "the command line)",
    )
    parser.add_argument(
        "--hf-dir",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="a directory `hf:<path>` base models may be loaded from (repeatable); without "
        "one, hf: models come only from the local Hugging Face cache",
    )
    parser.add_argument(
        "--hf-cache",
        type=Path,
        metavar="DIR",
        help="the Hugging Face cache whose Llama and Qwen2 checkpoints are served by repo id "
        "(owner/name) and listed in the capabilities (default: $HF_HUB_CACHE, else "
        "$HF_HOME/hub, else ~/.cache/huggingface/hub)",
    )
    parser.add_argument(
        "--capture",
        type=Path,
        metavar="FILE",
        help="append every exchange of the OpenAI-compatible routes to FILE as a JSONL line "
        "`whitney-flows run sft` reads (off by default: FILE keeps what users send)",
    )
    limits = parser.add_argument_group("limits (docs/api.md, Limits; in the capabilities)")
    for name, default in Limits().document().items():
        limits.add_argument(
            f"--{name.replace('_', '-')}",
            type=_count,
            default=default,
            metavar="N",
            help=f"{LIMIT_HELP[name]} (default: {default})",
        )
    faults = parser.add_argument_group("fault injection (off by default)")
    faults.add_argument(
        "--latency-ms", type=_non_negative, default=0.0, help="added to every answer"
    )
    faults.add_argument(
        "--fail-before-rate",
        type=_rate,
        default=0.0,
        help="share of operation POSTs answered 503 before they are journaled",
    )
    faults.add_argument(
        "--drop-after-commit-rate",
        type=_rate,
        default=0.0,
        help="share of operation POSTs whose answer is replaced by a 503 or a closed "
        "connection after the operation was journaled",
    )
    faults.add_argument("--fault-seed", type=int, default=0, help="seed of the fault draws")
    parser.add_argument(
        "--gap-timeout-s",
        type=_positive,
        default=DEFAULT_GAP_TIMEOUT_S,
        help="how long an operation waits for a missing seq_id before failing with seq_gap",
    )
    parser.add_argument(
        "--session-ttl-s",
        type=_non_negative,
        default=DEFAULT_SESSION_TTL_S,
        help="a session's lease: without a heartbeat for this long it is closed and its runs "
        "cancelled (0: never)",
    )
    parser.add_argument(
        "--tinker-url",
        default=None,
        help="run provider-tinker runs on this Tinker endpoint through the official SDK (the "
        "key from $TINKER_API_KEY); without it they run on the CPU engine",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="server log level",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Serve until interrupted; 0 on a clean stop, 2 when the server cannot start."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "serve":
        args_list = args_list[1:]
    args = build_parser().parse_args(args_list)
    if args.api_key:
        print(
            f"{PROG}: warning: --api-key is visible to other users of this machine (ps); "
            f"prefer ${API_KEYS_ENV} or --api-keys-file",
            file=sys.stderr,
        )
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        check_dependencies()
        data_dir = check_data_dir(args.data_dir or default_data_dir())
        keys = [*args.api_key, *api_keys_from_env(), *keys_from_file(args.api_keys_file)]
        generated = not keys
        if generated:
            keys = [generate_api_key()]
        if args.capture and not args.capture.expanduser().resolve().parent.is_dir():
            raise ServerStartError(f"--capture: no directory for {str(args.capture)!r}")
        from whitney.local.app import create_app
        from whitney.local.service import WhitneyService

        config = ServerConfig(
            data_dir=data_dir,
            api_keys=keys,
            latency_ms=args.latency_ms,
            fail_before_rate=args.fail_before_rate,
            drop_after_commit_rate=args.drop_after_commit_rate,
            fault_seed=args.fault_seed,
            gap_timeout_s=args.gap_timeout_s,
            session_ttl_s=args.session_ttl_s,
            limits=Limits(**{name: getattr(args, name) for name in LIMIT_HELP}),
            hf_dirs=tuple(path.expanduser().resolve() for path in args.hf_dir),
            hf_cache=(args.hf_cache or cache_dir()).expanduser().resolve(),
            capture=args.capture.expanduser().resolve() if args.capture else None,
            tinker_url=tinker_url(args.tinker_url),
        )
        try:
            service = WhitneyService(config)  # owns the data directory from here on
        except DataDirOwned as exc:
            raise ServerStartError(f"{exc}: stop it, or give another --data-dir") from None
        except (sqlite3.Error, OSError) as exc:
            raise ServerStartError(
                f"cannot open the journal under {str(data_dir)!r}: {exc}"
            ) from None
        try:
            sock = bind_socket(args.host, args.port)
        except ServerStartError:
            service.shutdown()
            raise
    except ServerStartError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_START_FAILURE
    service.preload_engine()
    host, port = sock.getsockname()[:2]
    shown_host = f"[{host}]" if ":" in host else host
    server = make_uvicorn(create_app(service), args.host, port, log_level=args.log_level)
    if generated:
        print(
            f"API key (generated for this start; set ${API_KEYS_ENV} or --api-keys-file to "
            f"choose one): {keys[0]}"
        )
    print(
        f"Whitney embedded server ready at http://{shown_host}:{port} "
        f"(data dir {data_dir}, {len(keys)} API key{'s' if len(keys) != 1 else ''}); "
        "Ctrl-C stops it",
        flush=True,
    )
    # uvicorn stops gracefully on SIGINT / SIGTERM, then re-raises the signal under the
    # handlers found at start: make SIGTERM, like SIGINT, end here so the cleanup below runs
    wake_waiters_on_exit(server, service)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        service.wake_waiters()
        service.shutdown()
    print("Whitney embedded server stopped", flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
