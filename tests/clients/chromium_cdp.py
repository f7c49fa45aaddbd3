"""Headless Debian Chromium driven over the Chrome DevTools Protocol, with `websockets` only."""
from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import websockets

# The flags that work as root in a container, without a display or network access.
BASE_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--remote-debugging-port=0")


class CdpError(Exception):
    """A DevTools command failed, or a page script threw."""


class Page:
    """One tab, addressed through a flattened DevTools session."""

    def __init__(self, browser: Chromium, session_id: str) -> None:
        self.browser, self.session_id = browser, session_id

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        return await self.browser.send(method, params, self.session_id)

    async def evaluate(self, expression: str, user_gesture: bool = False) -> Any:
        """The JSON value of ``expression`` (promises are awaited)."""
        reply = await self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                                awaitPromise=True, userGesture=user_gesture)
        if "exceptionDetails" in reply:
            raise CdpError(f"{expression!r} threw: {reply['exceptionDetails']}")
        return reply["result"].get("value")

    async def wait_for(self, expression: str, timeout: float, poll: float = 0.2) -> Any:
        """Poll until ``expression`` is truthy; return its value."""
        async def poll_until() -> Any:
            while not (value := await self.evaluate(expression)):
                await asyncio.sleep(poll)
            return value
        return await asyncio.wait_for(poll_until(), timeout)

    async def goto(self, url: str, timeout: float = 30.0) -> None:
        await self.send("Page.navigate", url=url)
        await self.wait_for(f"location.href.startsWith({json.dumps(url)}) && document.readyState === 'complete'",
                            timeout)

    async def screenshot(self, path: Path) -> None:
        reply = await self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(reply["data"]))


class Chromium:
    """A browser process and its DevTools websocket; commands are matched to replies by id."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self._next_id = 0
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for raw in self.ws:
            message = json.loads(raw)
            future = self._pending.pop(message.get("id", -1), None)
            if future is not None and not future.done():
                future.set_result(message)
        for future in self._pending.values():
            future.set_exception(CdpError("the DevTools connection closed"))

    async def send(self, method: str, params: dict[str, Any] | None = None,
                   session_id: str | None = None) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session_id is not None:
            message["sessionId"] = session_id
        future = asyncio.get_running_loop().create_future()
        self._pending[self._next_id] = future
        await self.ws.send(json.dumps(message))
        reply = await asyncio.wait_for(future, 30)
        if "error" in reply:
            raise CdpError(f"{method}: {reply['error']}")
        return dict(reply["result"])

    async def new_page(self) -> Page:
        target = await self.send("Target.createTarget", {"url": "about:blank"})
        attached = await self.send("Target.attachToTarget", {"targetId": target["targetId"], "flatten": True})
        return Page(self, attached["sessionId"])


async def _devtools_url(profile: Path, proc: asyncio.subprocess.Process, timeout: float) -> str:
    """Chromium writes its DevTools port and browser path to DevToolsActivePort once it listens."""
    active = profile / "DevToolsActivePort"
    deadline = asyncio.get_running_loop().time() + timeout
    while not active.exists() or len(active.read_text().split()) < 2:
        if proc.returncode is not None or asyncio.get_running_loop().time() > deadline:
            raise CdpError(f"chromium did not open DevTools (exit status {proc.returncode})")
        await asyncio.sleep(0.1)
    port, path = active.read_text().split()[:2]
    return f"ws://127.0.0.1:{port}{path}"


@contextlib.asynccontextmanager
async def launch(executable: str, profile: Path, flags: Sequence[str], log: Path) -> AsyncIterator[Chromium]:
    """Start Chromium with a new empty profile; close it (or kill its process group) on exit."""
    profile.mkdir(parents=True)
    with log.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            executable, *BASE_FLAGS, f"--user-data-dir={profile}", *flags, "about:blank",
            stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
    try:
        async with websockets.connect(await _devtools_url(profile, proc, 60), max_size=None) as ws:
            browser = Chromium(ws)
            yield browser
            with contextlib.suppress(CdpError, websockets.ConnectionClosed):
                await browser.send("Browser.close")
        await asyncio.wait_for(proc.wait(), 20)
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
