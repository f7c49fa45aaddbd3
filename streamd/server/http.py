"""Plain HTTP on the streaming port: a check of every request head before websockets parses it,
and the responses of the HTTP routes.

websockets only parses `GET` requests with bounded lines, and answers other methods, pipelined
requests and huge heads by dropping the connection with an ERROR traceback in the log.
`GuardedConnection` answers them properly instead: 405 for methods other than GET (and HEAD on the
plain HTTP routes), 431 for a head over `MAX_HEAD_BYTES`, and only the first of pipelined plain
HTTP requests is answered (with `Connection: close`).
"""
from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from websockets.asyncio.server import ServerConnection
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidMessage
from websockets.http11 import Response

MAX_HEAD_BYTES = 16 * 1024
# What websockets parses in place of a refused request, so the refusal goes out through its
# usual response path (`GuardedConnection.refusal`, returned by the app's process_request).
_STAND_IN = b"GET /.refused HTTP/1.1\r\nHost: streamd\r\n\r\n"


def response(status: HTTPStatus, body: bytes, content_type: str = "text/plain; charset=utf-8",
             extra: dict[str, str] | None = None) -> Response:
    """A complete response that closes the connection."""
    headers = Headers({"Content-Type": content_type, "Content-Length": str(len(body)), "Connection": "close"})
    for k, v in (extra or {}).items():
        headers[k] = v
    return Response(status.value, status.phrase, headers, body)


def without_body(r: Response) -> Response:
    """The answer to a HEAD request: the same status and headers (Content-Length included)."""
    return Response(r.status_code, r.reason_phrase, r.headers, b"")


class GuardedConnection(ServerConnection):
    """A websocket server connection that vets the request head first (see the module doc).

    Attributes:
        head_only: the request was HEAD (it reaches websockets as GET; answer without a body).
        refusal: the response to send instead of handling the request, if it was refused.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.head_only = False
        self.refusal: Response | None = None
        self._head = b""
        self._vetted = False
        self._upgrade = False  # a websocket upgrade: what follows the head is the stream

    def data_received(self, data: bytes) -> None:
        if self._vetted:
            if self._upgrade:
                super().data_received(data)
            return  # bytes after a plain HTTP request (pipelining): it is answered, then closed
        self._head += data
        end = self._head.find(b"\r\n\r\n")
        if end < 0 and len(self._head) <= MAX_HEAD_BYTES:
            return  # the head is not complete yet (the handshake timeout bounds the wait)
        self._vetted = True
        head, rest, self._head = self._head[: end + 4], self._head[end + 4:], b""
        if end < 0 or end + 4 > MAX_HEAD_BYTES:
            return self._refuse(response(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
                                         f"request head over {MAX_HEAD_BYTES} bytes\n".encode()))
        method, _, after = head.partition(b" ")
        self._upgrade = b"\r\nupgrade: websocket" in head.lower()
        if method == b"HEAD" and not self._upgrade:
            self.head_only = True
            head = b"GET " + after
        elif method != b"GET":
            return self._refuse(response(HTTPStatus.METHOD_NOT_ALLOWED, b"only GET (and HEAD) here\n",
                                         extra={"Allow": "GET, HEAD"}))
        super().data_received(head + rest if self._upgrade else head)

    def _refuse(self, r: Response) -> None:
        self.refusal = r
        super().data_received(_STAND_IN)


_CLIENT_FAULTS = (InvalidMessage, InvalidHandshake, ConnectionClosed, EOFError, ConnectionError, TimeoutError)


class _HandshakeFaults(logging.Filter):
    """websockets logs every failed opening handshake at ERROR with a traceback; those caused by
    the client (a bad or incomplete request, a connection dropped or too slow) are INFO lines."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if record.msg == "opening handshake failed" and isinstance(exc, _CLIENT_FAULTS):
            cause = exc.__cause__ or exc.__context__
            record.msg = "opening handshake failed: %s%s"
            record.args = (exc, f" ({cause})" if cause else "")
            record.levelno, record.levelname, record.exc_info, record.exc_text = logging.INFO, "INFO", None, None
        return True


def quiet_client_handshake_faults() -> None:
    """Install the filter on websockets' server logger (once)."""
    logger = logging.getLogger("websockets.server")
    if not any(isinstance(f, _HandshakeFaults) for f in logger.filters):
        logger.addFilter(_HandshakeFaults())
