"""Re-reading the configuration on SIGHUP (`systemctl reload`).

Settings read per stream or per message take effect at once (new streams see them; timeouts also
apply to live streams): the `LIVE` ones. Everything else (the port, the model, the device,
`max_streams`...) is kept as it is and logged as needing a restart. A file that fails to load
changes nothing.
"""
from __future__ import annotations

import logging
from dataclasses import fields, replace
from typing import Any

from streamd.config import Config

log = logging.getLogger("streamd.server")

LIVE_SECTIONS = ("endpointing", "gate")
LIVE = frozenset({
    "server.max_backlog_s", "server.backlog_policy", "server.idle_timeout_s", "server.max_session_s",
    "server.drain_timeout_s", "server.send_timeout_s", "server.token_file", "server.allowed_origins",
    "log.level", "log.access",
})
SECTIONS = ("server", "engine", "endpointing", "gate", "admin", "log")


def is_live(setting: str) -> bool:
    """Whether `section.key` can change in a running daemon."""
    return setting in LIVE or setting.split(".")[0] in LIVE_SECTIONS


def changes(old: Config, new: Config) -> list[tuple[str, Any, Any]]:
    """(section.key, old value, new value) of every setting that differs."""
    out = []
    for name in SECTIONS:
        a, b = getattr(old, name), getattr(new, name)
        out += [(f"{name}.{f.name}", getattr(a, f.name), getattr(b, f.name))
                for f in fields(a) if getattr(a, f.name) != getattr(b, f.name)]
    return out


def merge(old: Config, new: Config) -> tuple[Config, list[str], list[str]]:
    """The running config with `new`'s live settings; and the names of the settings changed live
    and of those that need a restart."""
    live, restart = [], []
    sections: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    for setting, _, value in changes(old, new):
        section, key = setting.split(".")
        if is_live(setting):
            sections[section][key] = value
            live.append(setting)
        else:
            restart.append(setting)
    merged = replace(old, **{name: replace(getattr(old, name), **kw) for name, kw in sections.items() if kw})
    return merged, live, restart


def describe(old: Config, new: Config, names: list[str]) -> str:
    """`section.key old -> new, ...` for the log."""
    by_name = {name: (a, b) for name, a, b in changes(old, new)}
    return ", ".join(f"{n} {_show(by_name[n][0])} -> {_show(by_name[n][1])}" for n in names)


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ",".join(map(str, value)) + "]"
    return "unset" if value is None else str(value)
