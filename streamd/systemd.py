"""The sd_notify protocol, written directly to ``$NOTIFY_SOCKET``.

Every method is a no-op returning False outside systemd (no ``NOTIFY_SOCKET``)
and never raises: a failed notification is logged at debug level, like
gunicorn does. Standalone on purpose: no asyncio, no torch, nothing from streamd.
"""
from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Mapping, MutableMapping


log = logging.getLogger("streamd.systemd")


class Notifier:
    """Talks to the service manager that started this process.

    Args:
        environ: where to read ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and
            ``WATCHDOG_PID``; ``os.environ`` by default.
        unset_environment: remove those variables from ``environ`` so child
            processes do not notify on our behalf (``sd_notify(3)``).
    """

    def __init__(self, environ: MutableMapping[str, str] | None = None, *,
                 unset_environment: bool = False) -> None:
        env = os.environ if environ is None else environ
        self._address = _address(env.get("NOTIFY_SOCKET", ""))
        self._watchdog_usec = _watchdog_usec(env)
        if unset_environment:
            for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
                env.pop(name, None)
        self._sock: socket.socket | None = None

    @property
    def enabled(self) -> bool:
        """Whether a service manager is listening."""
        return self._address is not None

    @property
    def watchdog_interval(self) -> float | None:
        """Seconds between ``watchdog()`` pings (half of ``WatchdogSec=``), or None if off."""
        return None if self._watchdog_usec is None else self._watchdog_usec / 2e6

    def notify(self, *assignments: str) -> bool:
        """Send raw ``KEY=value`` lines in one datagram; True when it was sent."""
        if self._address is None:
            return False
        message = "\n".join(assignments).encode()
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._sock.sendto(message, self._address)
        except OSError as err:
            log.debug("sd_notify %r to %r failed: %s", message, self._address, err)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        """Startup finished: the service can take work (``READY=1``)."""
        return self.notify("READY=1", *_status(status))

    def reloading(self, status: str | None = None) -> bool:
        """A configuration reload started (``RELOADING=1``); send ``ready()`` when done."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}", *_status(status))

    def stopping(self, status: str | None = None) -> bool:
        """Shutdown started (``STOPPING=1``)."""
        return self.notify("STOPPING=1", *_status(status))

    def status(self, text: str) -> bool:
        """A one-line state for ``systemctl status`` (``STATUS=``)."""
        return self.notify(*_status(text))

    def watchdog(self) -> bool:
        """Ping the watchdog (``WATCHDOG=1``); call it every ``watchdog_interval`` seconds."""
        return self.notify("WATCHDOG=1")

    def close(self) -> None:
        """Close the socket; later calls reopen it."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _status(text: str | None) -> tuple[str, ...]:
    if text is None:
        return ()
    return ("STATUS=" + " ".join(text.splitlines()),)


def _address(value: str) -> str | None:
    """The socket address: a path, or ``@name`` for the abstract namespace."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return "\0" + value[1:]
    if value:
        log.debug("ignoring unsupported NOTIFY_SOCKET %r", value)
    return None


def _watchdog_usec(env: Mapping[str, str]) -> int | None:
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    pid = env.get("WATCHDOG_PID")
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return None
    return usec
