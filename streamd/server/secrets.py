"""Files that hold secrets (tokens, TLS keys): read them, and warn when other users can read them."""
from __future__ import annotations

import logging
import stat
from pathlib import Path

log = logging.getLogger("streamd.server")


def warn_if_exposed(path: Path, what: str) -> None:
    """Log a warning if users other than the owner and group may read or write `path`."""
    mode = path.stat().st_mode
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        log.warning("%s %s is readable or writable by every user (mode %o): chmod o-rw %s",
                    what, path, stat.S_IMODE(mode), path)


def read_token(path: Path, what: str) -> str:
    """The token in `path` (whitespace stripped); raises ValueError if it is empty."""
    warn_if_exposed(path, what)
    token = path.read_text().strip()
    if not token:
        raise ValueError(f"{what} {path} is empty")
    return token
