"""What every client shares: the handshake, errors, retries, printing results.

Only the documented protocol is used (``streamd.protocol``, the module the server uses too, is
Sans-I/O and imports no torch). :func:`handshake` opens the websocket and maps refusals to errors;
:func:`retry_delay` decides, from the error, whether and when to reconnect. The stream itself
(``start``, audio, results, resuming after a drop) is ``streamd.clients.resume.ResumingStream``.
"""
from __future__ import annotations

import random
import shutil
import ssl
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import TextIO
from urllib.parse import urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from streamd.protocol import FATAL_ERRORS, HANDSHAKE_REFUSALS, STREAM_PATH

DEFAULT_URL = "ws://127.0.0.1:8765"


class StreamError(Exception):
    """The server ended the stream with an ``error`` message (or refused the handshake)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @property
    def retryable(self) -> bool:
        """A new connection may succeed (overload, server fault, expiry)."""
        return self.code not in FATAL_ERRORS


# What a daemon's 503 body says (streamd.server.front), in the words a user reads.
BUSY_REASONS = {"draining": "the daemon is draining (it takes no new streams)",
                "at capacity": "the daemon is at capacity"}


class ServerBusy(StreamError):
    """HTTP 503 at the handshake: the daemon is full or draining (``body`` says which); retry
    after ``retry_after``."""

    def __init__(self, retry_after: float, body: bytes | None = None) -> None:
        why = BUSY_REASONS.get((body or b"").decode("utf-8", "replace").strip(), "the daemon is full or draining")
        super().__init__("unavailable", f"{why} (retry after {retry_after:g} s)")
        self.retry_after = retry_after


class ConnectionLost(StreamError):
    """The connection closed without a ``summary`` (daemon killed, network gone)."""

    def __init__(self, close_code: int | None) -> None:
        super().__init__("connection_lost", f"connection closed without a summary (code {close_code})")
        self.close_code = close_code


def stream_url(url: str) -> str:
    """The stream endpoint for ``url``: ``ws://host:port`` gets the protocol path appended."""
    parts = urlsplit(url)
    if parts.scheme not in ("ws", "wss"):
        raise ValueError(f"expected a ws:// or wss:// URL, got {url!r}")
    path = parts.path if parts.path not in ("", "/") else STREAM_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


def read_token(path: str | None) -> str | None:
    """The bearer token in file ``path`` (surrounding whitespace stripped); None without a path.

    Raises:
        ValueError: the file holds no token.
    """
    if path is None:
        return None
    token = Path(path).read_text().strip()
    if not token:
        raise ValueError(f"token file {path} is empty")
    return token


def ssl_context(url: str, cafile: str | None) -> ssl.SSLContext | None:
    """For wss://, a context trusting the system CAs plus ``cafile`` (e.g. a self-signed cert)."""
    if urlsplit(url).scheme != "wss":
        return None
    return ssl.create_default_context(cafile=cafile)


@dataclass
class Backoff:
    """Exponential reconnection delays with jitter: 0.5 s, 1 s, 2 s ... up to ``maximum``."""

    initial: float = 0.5
    maximum: float = 10.0
    factor: float = 2.0
    jitter: float = 0.1
    _attempt: int = 0

    def next(self) -> float:
        """The delay before the next attempt."""
        delay = min(self.maximum, self.initial * self.factor ** self._attempt)
        self._attempt += 1
        return delay * random.uniform(1 - self.jitter, 1 + self.jitter)


def refused(exc: BaseException) -> bool:
    """Nothing listens at the address (every address of the name refused the connection)."""
    return isinstance(exc, ConnectionRefusedError) or (
        isinstance(exc, OSError) and exc.errno is None and "Connect call failed" in str(exc))


def explain(url: str, exc: BaseException) -> str:
    """One line on why a stream to `url` failed, with a hint when no daemon listens there."""
    if refused(exc):
        return f"{url}: connection refused: is `streamd serve` running there?"
    return f"{url}: {str(exc) or type(exc).__name__}"


def retry_delay(exc: BaseException, backoff: Backoff) -> float | None:
    """Seconds to wait before reconnecting after ``exc``, or None when retrying cannot help."""
    if isinstance(exc, ServerBusy):
        return max(exc.retry_after, backoff.next())
    if isinstance(exc, StreamError):
        return backoff.next() if exc.retryable else None
    if isinstance(exc, (OSError, TimeoutError, ConnectionClosed)):  # refused, reset, unreachable
        return backoff.next()
    return None


async def handshake(endpoint: str, cafile: str | None, open_timeout: float, token: str | None) -> ClientConnection:
    """Open the websocket (with ``Authorization: Bearer token`` if given).

    Raises:
        ServerBusy: HTTP 503 (full or draining).
        StreamError: any other refusal.
        OSError, TimeoutError: the daemon cannot be reached.
    """
    try:
        return await connect(endpoint, ssl=ssl_context(endpoint, cafile), open_timeout=open_timeout,
                             compression=None, max_size=None,
                             additional_headers={"Authorization": f"Bearer {token}"} if token else None)
    except InvalidStatus as e:
        response = e.response
        if response.status_code == HTTPStatus.SERVICE_UNAVAILABLE:
            raise ServerBusy(float(response.headers.get("Retry-After", "1")),
                             bytes(response.body) if response.body is not None else None) from None
        if response.status_code in HANDSHAKE_REFUSALS:
            code, why = HANDSHAKE_REFUSALS[response.status_code]
            if response.status_code == HTTPStatus.UNAUTHORIZED and token:
                why = "wrong bearer token: the daemon does not take the one in --token-file"
            raise StreamError(code, f"HTTP {response.status_code} from {endpoint}: {why}") from None
        raise StreamError("handshake_refused", f"HTTP {response.status_code} from {endpoint}") from None
    except InvalidHandshake as e:
        raise StreamError("handshake_failed", f"{endpoint}: {e}") from None


def format_time(seconds: float) -> str:
    """``MM:SS.mmm``, or ``H:MM:SS.mmm`` from one hour on (as Whisper's CLI prints times)."""
    ms = round(seconds * 1000)
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    text = f"{minutes:02d}:{rest // 1000:02d}.{rest % 1000:03d}"
    return f"{hours}:{text}" if hours else text


class LiveDisplay:
    """Prints results: the partial on one line rewritten in place, each final on its own line.

    On a terminal (``live``) the partial shows the tail of the hypothesis, cut to the terminal
    width so the line never wraps; elsewhere (pipes, files) only finals are printed. Status
    messages go to ``err``.
    """

    def __init__(self, out: TextIO, err: TextIO, live: bool | None = None) -> None:
        self.out, self.err = out, err
        self.live = out.isatty() if live is None else live
        self._partial_shown = False
        self.finals = 0  # finals with text shown

    def partial(self, text: str) -> None:
        if not self.live:
            return
        width = shutil.get_terminal_size().columns - 1
        shown = text if len(text) <= width else "…" + text[-(width - 1):]
        self.out.write("\r\x1b[K" + shown)
        self.out.flush()
        self._partial_shown = True

    def final(self, text: str, start: float, end: float) -> None:
        self._clear()
        if text:
            self.finals += 1
            self.out.write(f"[{format_time(start)} --> {format_time(end)}] {text}\n")
            self.out.flush()

    def status(self, message: str) -> None:
        self._clear()
        self.err.write(message + "\n")
        self.err.flush()

    def _clear(self) -> None:
        if self._partial_shown:
            self.out.write("\r\x1b[K")
            self.out.flush()
            self._partial_shown = False
