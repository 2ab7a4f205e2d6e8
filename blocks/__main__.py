"""`python -m blocks`: save and check `WhitneyCredentials` blocks on the current Prefect server
(PREFECT_API_URL).

    python -m blocks save whitney --base-url http://127.0.0.1:8765 [--overwrite]
    python -m blocks check whitney

The key is never a command-line argument (it would land in the shell history and `ps`): it
comes from WHITNEY_API_KEY, else a hidden prompt on a terminal, else one line of stdin.
Exit 0 on success, 1 when the server or the block says no, 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys

from pydantic import ValidationError

from whitney.client import API_KEY_ENV

PROG = "python -m blocks"


def _read_key() -> str:
    key = os.environ.get(API_KEY_ENV)
    if key:
        return key
    if sys.stdin.isatty():
        return getpass.getpass("Whitney API key: ")
    return sys.stdin.readline().strip()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    save = commands.add_parser(
        "save", help=f"save a WhitneyCredentials block (key from {API_KEY_ENV} or a prompt)"
    )
    save.add_argument("name", help="block name, e.g. whitney")
    save.add_argument("--base-url", required=True, help="Whitney base URL")
    save.add_argument("--timeout-s", type=float, default=30.0)
    save.add_argument("--max-attempts", type=int, default=6)
    save.add_argument("--max-retry-seconds", type=float, default=120.0)
    save.add_argument("--poll-wait-s", type=float, default=30.0)
    save.add_argument(
        "--price-table", default=None, help='JSON: USD per 1,000 tokens by kind, {"sample": 0.1}'
    )
    save.add_argument("--overwrite", action="store_true", help="replace a block of that name")
    check = commands.add_parser("check", help="load a block and ask its server for capabilities")
    check.add_argument("name")
    return parser


def _save(args: argparse.Namespace) -> int:
    from blocks.credentials import WhitneyCredentials

    try:
        price_table = json.loads(args.price_table) if args.price_table else None
    except json.JSONDecodeError as error:
        print(f"{PROG}: --price-table is not JSON: {error}", file=sys.stderr)
        return 2
    key = _read_key()
    try:
        block = WhitneyCredentials(
            base_url=args.base_url,
            api_key=key,
            timeout_s=args.timeout_s,
            max_attempts=args.max_attempts,
            max_retry_seconds=args.max_retry_seconds,
            poll_wait_s=args.poll_wait_s,
            price_table=price_table,
        )
    except ValidationError as error:
        first = error.errors(include_url=False, include_input=False)[0]
        field = ".".join(str(part) for part in first["loc"])
        print(f"{PROG}: {field}: {first['msg']}", file=sys.stderr)
        return 2
    try:
        document_id = block.save(args.name, overwrite=args.overwrite)
    except ValueError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 1
    print(f"saved WhitneyCredentials block {args.name!r} ({args.base_url}) id {document_id}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from blocks.credentials import BlockNotFound, load_credentials
    from whitney.errors import WhitneyError

    try:
        block = load_credentials(args.name)
    except BlockNotFound as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return 1
    try:
        with block.get_client() as client:
            capabilities = client.capabilities()
    except WhitneyError as error:
        print(f"{PROG}: {block.base_url}: {error}", file=sys.stderr)
        return 1
    providers = ", ".join(sorted(capabilities.providers))
    print(f"{args.name}: {block.base_url} answers; providers {providers}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "save":
        return _save(args)
    return _check(args)


if __name__ == "__main__":
    sys.exit(main())
