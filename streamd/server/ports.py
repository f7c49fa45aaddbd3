"""Before the model loads: the ports and the admin socket the daemon will listen on are free,
so that a port in use is one clear line at once, not a traceback after a long start."""
from __future__ import annotations

import errno
import socket
from pathlib import Path

from streamd.config import Config
from streamd.errors import ConfigError
from streamd.server.admin import claim_socket_path


def check_free(host: str, port: int, flag: str) -> None:
    """Bind (and release) every address `host` resolves to on `port`, as the listener will.

    Raises:
        ConfigError: the port is in use, or the address cannot be bound.
    """
    if port == 0:
        return
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"cannot listen on {host}:{port}: {e.strerror}") from None
    for family, kind, proto, _, addr in addresses:
        with socket.socket(family, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the listener does
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind(addr)
            except OSError as e:
                raise bind_error(e, host, port, flag) from None


BIND_ERRORS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})  # what binding a port raises


def bind_error(e: OSError, host: str, port: int, flag: str, *, late: bool = False) -> ConfigError:
    """`e`, raised binding `host`:`port`, in a user's words (`late`: at the listener's own bind,
    after `check_free` found the port free: another program took it while the model loaded)."""
    if e.errno == errno.EADDRINUSE:
        when = " (taken while the model loaded)" if late else ""
        return ConfigError(f"port {port} on {host} is already in use{when} (another streamd or another program "
                           f"listens there); stop it or choose another with {flag}")
    return ConfigError(f"cannot listen on {host}:{port}: {e.strerror}")


def check_listeners(cfg: Config) -> None:
    """The stream port, the admin TCP port and the admin socket path are free (see `check_free`,
    `claim_socket_path`).

    Raises:
        ConfigError: one of them is taken.
    """
    check_free(cfg.server.host, cfg.server.port, "--port")
    if cfg.admin.port is not None:
        check_free(cfg.admin.host, cfg.admin.port, "--admin-port")
    if cfg.admin.socket is not None:
        claim_socket_path(Path(cfg.admin.socket))
