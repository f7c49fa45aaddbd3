"""Who may open a stream: an optional bearer token and the browser origins allowed.

Checked on the stream path before the websocket handshake (`App.process_request`):

- `Origin` (sent by browsers, not by other clients): the page's own origin (the `Origin` host is
  the request's `Host`) and the origins in `server.allowed_origins` are let in, `*` lets in any;
  others get HTTP 403. This stops cross-site websocket hijacking: a page elsewhere cannot open a
  stream with the visitor's network position.
- With `server.token_file` set, the request must carry the token: `Authorization: Bearer TOKEN`
  (or `Token TOKEN`, as Deepgram's clients send it), or `?token=TOKEN` in the URL for browsers
  (they cannot set headers on a websocket); else HTTP 401.
"""
from __future__ import annotations

import hmac
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from websockets.datastructures import Headers


@dataclass(frozen=True)
class Refusal:
    """Why a handshake is refused: the HTTP status, the rejection metric's reason and a message."""

    status: HTTPStatus
    reason: str
    message: str


class Access:
    """The stream port's access rules."""

    def __init__(self, token: str | None, allowed_origins: tuple[str, ...]) -> None:
        self._token = token.encode() if token is not None else None
        self._any_origin = "*" in allowed_origins
        self._origins = frozenset(allowed_origins)

    def check(self, path: str, headers: Headers) -> Refusal | None:
        """None when a request for `path` (with its query) with `headers` may open a stream."""
        origin = headers.get("Origin")
        if origin is not None and not self._origin_allowed(origin, headers.get("Host", "")):
            return Refusal(HTTPStatus.FORBIDDEN, "origin", f"origin {origin[:200]!r} is not allowed\n")
        if self._token is not None and not self._token_given(path, headers):
            return Refusal(HTTPStatus.UNAUTHORIZED, "unauthorized", "missing or wrong bearer token\n")
        return None

    def _origin_allowed(self, origin: str, host: str) -> bool:
        origin = origin.strip().lower().rstrip("/")
        if self._any_origin or origin in self._origins:
            return True
        parts = urlsplit(origin)
        return parts.scheme in ("http", "https") and bool(host) and parts.netloc == host.strip().lower()

    def _token_given(self, path: str, headers: Headers) -> bool:
        assert self._token is not None
        offered = []
        scheme, _, credentials = headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() in ("bearer", "token"):
            offered.append(credentials.strip())
        offered += parse_qs(urlsplit(path).query).get("token", [])
        return any(hmac.compare_digest(t.encode(), self._token) for t in offered)
