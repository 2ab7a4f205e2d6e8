"""Headless Debian Chromium driven over the Chrome DevTools Protocol: a process started with
`--remote-debugging-port=0` (the port it picks is read from DevToolsActivePort), one page
target, and a small synchronous websocket client (`websockets`, a prefect dependency).

Only what the browser test needs: navigate, evaluate JavaScript, real mouse clicks and
keyboard input at an element's position, screenshots.
"""

from __future__ import annotations

import base64
import contextlib
import json
import shutil
import signal
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx
from websockets.sync.client import ClientConnection, connect

from .harness import HarnessError, ManagedProcess, wait_for

CHROMIUM_NAMES = ("chromium", "chromium-browser")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--window-size=1400,1600",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
)


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class CDPError(HarnessError):
    pass


class Page:
    """One page target: commands by id, events kept until asked for."""

    def __init__(self, ws_url: str, timeout: float = 30.0) -> None:
        self.timeout = timeout
        self._ws: ClientConnection = connect(
            ws_url, max_size=None, open_timeout=timeout, close_timeout=5
        )
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        self._ws.close()

    def send(
        self, method: str, params: Mapping[str, Any] | None = None, timeout: float | None = None
    ) -> Any:
        self._next_id += 1
        ident = self._next_id
        self._ws.send(json.dumps({"id": ident, "method": method, "params": dict(params or {})}))
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CDPError(f"no answer to {method} within {timeout or self.timeout:g}s")
            try:
                message = json.loads(self._ws.recv(timeout=remaining))
            except TimeoutError:
                continue
            if message.get("id") == ident:
                if "error" in message:
                    raise CDPError(f"{method}: {message['error']}")
                return message.get("result", {})
            if "method" in message:
                self.events.append(message)

    # -- JavaScript -------------------------------------------------------------------------

    def evaluate(self, expression: str, timeout: float | None = None) -> Any:
        """The value of a JavaScript expression (promises awaited), as JSON."""
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            timeout=timeout,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CDPError(f"JavaScript error: {text}\nin: {expression[:500]}")
        return result.get("result", {}).get("value")

    def wait_js(self, what: str, expression: str, timeout: float = 30.0) -> Any:
        """Evaluate `expression` until it is truthy; its value."""
        return wait_for(what, lambda: self.evaluate(expression) or None, timeout, interval=0.25)

    # -- navigation and input ---------------------------------------------------------------

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", {"url": url})
        self.wait_js(f"{url} to load", "document.readyState === 'complete'", timeout=30)

    def click_at(self, x: float, y: float) -> None:
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1},
            )

    def center_of(self, selector_js: str) -> tuple[float, float]:
        """The center of the element `selector_js` evaluates to, scrolled into view."""
        box = self.evaluate(
            f"(() => {{ const el = {selector_js}; if (!el) return null;"
            " el.scrollIntoView({block: 'center'}); const r = el.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )
        if not box:
            raise CDPError(f"no element for {selector_js}")
        return box[0], box[1]

    def click(self, selector_js: str) -> None:
        """Click the element's center once it holds still: on a page still laying out (after
        a resize, say) a click at a stale position lands beside the element."""

        def steady() -> tuple[float, float] | None:
            before = self.center_of(selector_js)
            time.sleep(0.1)
            after = self.center_of(selector_js)
            return after if after == before else None

        self.click_at(*wait_for(f"{selector_js[:80]} to hold still", steady, 10, interval=0.1))

    def key(self, key: str, code: str, key_code: int, modifiers: int = 0) -> None:
        for kind in ("rawKeyDown", "keyUp"):
            self.send(
                "Input.dispatchKeyEvent",
                {
                    "type": kind,
                    "key": key,
                    "code": code,
                    "windowsVirtualKeyCode": key_code,
                    "modifiers": modifiers,
                },
            )

    def type_text(self, text: str) -> None:
        self.send("Input.insertText", {"text": text})

    def select_all(self) -> None:
        self.key("a", "KeyA", 65, modifiers=2)  # Ctrl+A

    def screenshot(self, path: Path, full_page: bool = True, max_height: int = 8000) -> Path:
        """A PNG of the page. `full_page`: the viewport is made as tall as the tallest
        scrolling content first (the Prefect UI scrolls an inner container, which
        `captureBeyondViewport` does not unroll), then restored."""
        width, height = self.evaluate("[window.innerWidth, window.innerHeight]")
        if full_page:
            tallest = self.evaluate(
                "Math.max(document.documentElement.scrollHeight,"
                " ...[...document.querySelectorAll('*')].map(el => el.scrollHeight))"
            )
            self.send(
                "Emulation.setDeviceMetricsOverride",
                {
                    "width": width,
                    "height": min(max(height, tallest), max_height),
                    "deviceScaleFactor": 1,
                    "mobile": False,
                },
            )
            time.sleep(0.5)  # let the layout settle at the new size
        try:
            data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        finally:
            if full_page:
                self.send("Emulation.clearDeviceMetricsOverride")
                time.sleep(0.5)  # and back at the window's size
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path


class Chromium:
    """A headless Chromium with a fresh profile; `page()` is its first tab."""

    def __init__(self, binary: str, log_dir: Path, env: Mapping[str, str]) -> None:
        self.profile = Path(tempfile.mkdtemp(prefix="e2e-chromium-"))
        self.process = ManagedProcess(
            "chromium",
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            env=env,
            log_dir=log_dir,
            stop_signals=(signal.SIGTERM,),
        )
        active = self.profile / "DevToolsActivePort"

        def port() -> int | None:
            self.process.check_running()
            if active.exists():
                lines = active.read_text().splitlines()
                if lines and lines[0].isdigit():
                    return int(lines[0])
            return None

        self.port = wait_for(
            "Chromium's DevTools port", port, timeout=30, evidence=self.process.tail
        )
        self._page: Page | None = None

    def page(self) -> Page:
        if self._page is None:

            def target() -> str | None:
                targets = httpx.get(f"http://127.0.0.1:{self.port}/json/list", timeout=5).json()
                for item in targets:
                    if item.get("type") == "page" and item.get("webSocketDebuggerUrl"):
                        return item["webSocketDebuggerUrl"]
                return None

            url = wait_for("a Chromium page target", target, timeout=20)
            self._page = Page(url)
            self._page.send("Page.enable")
            self._page.send("Runtime.enable")
        return self._page

    def stop(self) -> None:
        try:
            if self._page is not None:
                # closing a dead socket must not mask the test's own error
                with contextlib.suppress(Exception):
                    self._page.close()
        finally:
            self.process.stop(timeout=10)
            shutil.rmtree(self.profile, ignore_errors=True)
