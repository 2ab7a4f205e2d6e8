"""docs/api.md lists every Tinker route the app serves, and only those; docs/tinker.md names
the SDK version the extra pins and the installed SDK is that version (this fails the day the
SDK moves: check the routes against the new SDK's source, then move the pin)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import tinker
from fastapi.routing import APIRoute

from tests.sdk.markdown import table
from whitney.local.app import create_app
from whitney.local.config import ServerConfig
from whitney.local.service import WhitneyService
from whitney.local.tinker import SDK_VERSION

ROOT = Path(__file__).resolve().parents[2]


def test_every_tinker_route_has_its_row(tmp_path: Path) -> None:
    service = WhitneyService(ServerConfig(data_dir=tmp_path, api_keys=["tml-k"]))
    try:
        app = create_app(service)
        served = {
            f"{method} {route.path}"
            for route in app.routes
            if isinstance(route, APIRoute) and route.path.startswith("/api/v1/")
            for method in route.methods
        }
    finally:
        service.shutdown()
    api = (ROOT / "docs" / "api.md").read_text()
    tinker_section = api.split("## Tinker-compatible routes", 1)[1].split("\n## ", 1)[0]
    rows = table(tinker_section, "| method and path | what |")
    documented = {re.sub(r"\{member\}", "{member:path}", row[0].strip("`")) for row in rows}
    assert documented == served


def test_the_served_sdk_version_is_pinned_installed_and_documented() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"tinker=={SDK_VERSION}" in extras["optional-dependencies"]["tinker"]
    assert tinker.__version__ == SDK_VERSION
    assert f"tinker=={SDK_VERSION}" in (ROOT / "docs" / "tinker.md").read_text()
