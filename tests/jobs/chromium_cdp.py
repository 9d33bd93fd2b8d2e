"""One headless chromium for a test session, driven over the DevTools protocol on a pipe (stdlib only).

`chromium --dump-dom` (tests/jobs/test_report_html.py) starts a browser per page and returns only the DOM.
This keeps one browser and one tab for every page a session loads, and answers what the page computed:
`Browser.load(path)` waits for the page's load event (every inline script, Plotly.newPlot included, has
run by then) and `Browser.evaluate(js)` returns the value of an expression in it. Console messages and
uncaught exceptions are collected per page load.

The protocol: the browser reads commands from its fd 3 and writes replies and events to its fd 4, each a
JSON object ended by a NUL byte (`--remote-debugging-pipe`).
"""

from __future__ import annotations

import fcntl
import json
import os
import select
import subprocess
import tempfile
from pathlib import Path
from typing import Any

LOG_LEVELS = ("warning", "error")  # of the browser's own messages, those a page check reports
WAIT_S = 60.0  # the longest wait for one reply or event: a hung browser fails the test instead of hanging it


class BrowserError(RuntimeError):
    pass


class Browser:
    def __init__(self, exe: str, width: int = 1400, height: int = 1000) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="kf-chromium-", ignore_cleanup_errors=True)
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:  # in the child: the protocol's fds 3 and 4 (copied above 9 first: never clobbered)
            r, w = (
                fcntl.fcntl(to_browser_r, fcntl.F_DUPFD, 10),
                fcntl.fcntl(from_browser_w, fcntl.F_DUPFD, 10),
            )
            os.dup2(r, 3)  # inheritable: they stay open across exec, the pipes' other fds do not
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
             "--no-first-run", "--no-default-browser-check", f"--user-data-dir={self._profile.name}",
             f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            close_fds=False, preexec_fn=fds,
        )  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._events: list[dict[str, Any]] = []
        self._next_id = 0
        self.session = ""
        self.size = (width, height)
        self.console: list[str] = []  # of the page loaded last: console messages and uncaught exceptions
        try:
            target = self.call("Target.createTarget", {"url": "about:blank"})
            attached = self.call("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
            self.session = attached["sessionId"]
            metrics = {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}
            self.call("Emulation.setDeviceMetricsOverride", metrics, self.session)
            self.call("Page.enable", {}, self.session)
            self.call("Runtime.enable", {}, self.session)
            self.call("Log.enable", {}, self.session)  # the browser's own: a file that did not load
        except BaseException:
            self.close()
            raise

    # ---- the protocol ----------------------------------------------------------------------------
    def _read_message(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_browser], [], [], WAIT_S)
            if not ready:
                raise BrowserError(f"chromium sent nothing for {WAIT_S:.0f} s")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise BrowserError(f"chromium closed its pipe (exit {self.proc.poll()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def call(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> Any:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self._events.append(reply)

    def _wait_event(self, method: str) -> dict[str, Any]:
        while True:
            for i, event in enumerate(self._events):
                if event["method"] == method and event.get("sessionId") == self.session:
                    return self._events.pop(i)
            self._events.append(self._read_message())

    def _collect_console(self) -> None:
        for event in self._events:
            if event.get("sessionId") != self.session:
                continue
            if event["method"] == "Runtime.consoleAPICalled":
                args = event["params"].get("args", [])
                text = " ".join(str(a.get("value", a.get("description", ""))) for a in args)
                self.console.append(f"console.{event['params'].get('type')}: {text}")
            elif event["method"] == "Log.entryAdded" and event["params"]["entry"]["level"] in LOG_LEVELS:
                entry = event["params"]["entry"]
                self.console.append(f"log.{entry['level']}: {entry['text']} {entry.get('url', '')}".strip())
            elif event["method"] == "Runtime.exceptionThrown":
                details = event["params"]["exceptionDetails"]
                self.console.append(f"exception: {details.get('exception', {}).get('description', details)}")
        self._events = [e for e in self._events if e.get("sessionId") != self.session]

    # ---- pages -----------------------------------------------------------------------------------
    def load(self, path: Path, width: int | None = None, height: int | None = None) -> None:
        """Open the file in the session's tab (a window of `width` x `height` px when given; they stay
        for the next pages) and return after its load event."""
        if (width or self.size[0], height or self.size[1]) != self.size:
            self.size = (width or self.size[0], height or self.size[1])
            metrics = {"width": self.size[0], "height": self.size[1], "deviceScaleFactor": 1, "mobile": False}
            self.call("Emulation.setDeviceMetricsOverride", metrics, self.session)
        self._events = [e for e in self._events if e.get("sessionId") != self.session]
        self.console = []
        reply = self.call("Page.navigate", {"url": Path(path).resolve().as_uri()}, self.session)
        if reply.get("errorText"):
            raise BrowserError(f"{path}: {reply['errorText']}")
        self._wait_event("Page.loadEventFired")
        self._collect_console()

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression on the page (JSON-serializable; a promise is awaited)."""
        reply = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            self.session,
        )
        if "exceptionDetails" in reply:
            raise BrowserError(f"{reply['exceptionDetails'].get('exception', reply['exceptionDetails'])}")
        self._collect_console()
        return reply["result"].get("value")

    def dom(self) -> str:
        """The page's DOM as it is now (after its scripts ran), serialized."""
        return self.evaluate("document.documentElement.outerHTML")

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            os.close(fd)
        self._profile.cleanup()
