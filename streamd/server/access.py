"""Who may open a stream: an optional bearer token and the browser origins and host names allowed.

Checked on the stream path before the websocket handshake (`App.process_request`):

- A request with two `Host`, `Origin`, `Authorization` or `OpenAI-Beta` headers is ambiguous:
  HTTP 400.
- `Origin` (sent by browsers, not by other clients): the origins in `server.allowed_origins` are
  let in (`*` lets in any), and the page's own origin (the `Origin` host is the request's `Host`)
  when that host is a name the daemon serves: an IP address, `localhost`, this machine's name,
  `server.host` or one in `server.allowed_hosts` (`*` any). Others get HTTP 403. This stops
  cross-site websocket hijacking (a page elsewhere cannot open a stream with the visitor's
  network position) and DNS rebinding (a page on a name the attacker points at 127.0.0.1 is its
  own origin, but not a name the daemon serves).
- With `server.token_file` set, the request must carry the token: `Authorization: Bearer TOKEN`
  (or `Token TOKEN`, as Deepgram's clients send it), or `?token=TOKEN` in the URL for browsers
  (they cannot set headers on a websocket); else HTTP 401, whose body says whether no token
  came or a wrong one.
"""
from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from http import HTTPStatus
from urllib.parse import parse_qs, urlsplit

from websockets.datastructures import Headers

SINGLE_HEADERS = ("Host", "Origin", "Authorization", "OpenAI-Beta")  # what the checks and faces read
LOCAL_NAMES = ("localhost", "*.localhost")
# The bodies of HTTP 401 (and the log line's reason): a client is told which it got wrong.
MISSING_TOKEN = "no bearer token (the daemon needs one: Authorization: Bearer TOKEN or ?token=TOKEN)"
WRONG_TOKEN = "wrong bearer token"


@dataclass(frozen=True)
class Refusal:
    """Why a handshake is refused: the HTTP status, the rejection metric's reason and a message."""

    status: HTTPStatus
    reason: str
    message: str


class Access:
    """The stream port's access rules. `hosts`: the names the daemon serves besides IP addresses
    (`*.example.com` for its subdomains, `*` for any)."""

    def __init__(self, token: str | None, allowed_origins: tuple[str, ...], hosts: Iterable[str]) -> None:
        self._token = token.encode() if token is not None else None
        self._any_origin = "*" in allowed_origins
        self._origins = frozenset(allowed_origins)
        self._hosts = frozenset(h.lower().rstrip(".") for h in (*LOCAL_NAMES, *hosts))

    def check(self, path: str, headers: Headers) -> Refusal | None:
        """None when a request for `path` (with its query) with `headers` may open a stream."""
        for name in SINGLE_HEADERS:
            if len(headers.get_all(name)) > 1:
                return Refusal(HTTPStatus.BAD_REQUEST, "bad_request", f"more than one {name} header\n")
        origin = headers.get("Origin")
        if origin is not None and not self._origin_allowed(origin, headers.get("Host", "")):
            return Refusal(HTTPStatus.FORBIDDEN, "origin", f"origin {origin[:200]!r} is not allowed\n")
        if self._token is not None and (problem := self._token_problem(path, headers)):
            return Refusal(HTTPStatus.UNAUTHORIZED, "unauthorized", problem + "\n")
        return None

    def _origin_allowed(self, origin: str, host: str) -> bool:
        origin = origin.strip().lower().rstrip("/")
        if self._any_origin or origin in self._origins:
            return True
        parts = urlsplit(origin)
        host = host.strip().lower()
        return (parts.scheme in ("http", "https") and bool(host) and parts.netloc == host
                and self._served(parts.hostname or ""))

    def _served(self, name: str) -> bool:
        """Whether the daemon answers to host `name` (an IP address always: no DNS to rebind)."""
        try:
            ipaddress.ip_address(name)
            return True
        except ValueError:
            pass
        name = name.rstrip(".")
        return ("*" in self._hosts or name in self._hosts
                or any(h.startswith("*.") and name.endswith(h[1:]) for h in self._hosts))

    def _token_problem(self, path: str, headers: Headers) -> str | None:
        """None when the request carries the token; else whether it carries none or a wrong one."""
        assert self._token is not None
        offered = []
        scheme, _, credentials = headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() in ("bearer", "token") and credentials.strip():
            offered.append(credentials.strip())
        offered += [t for t in parse_qs(urlsplit(path).query).get("token", []) if t]
        if not offered:
            return MISSING_TOKEN
        return None if any(hmac.compare_digest(t.encode(), self._token) for t in offered) else WRONG_TOKEN
