"""Logging setup: text and JSON lines, journald detection, levels."""
from __future__ import annotations

import io
import json
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamd.log import LOGGERS, configure, set_levels, under_journald


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    names = ("streamd", *LOGGERS)
    levels = {name: logging.getLogger(name).level for name in names}
    yield
    root.handlers[:], root.level = saved
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)
    logging.captureWarnings(False)


def journal_env(path: Path) -> dict[str, str]:
    stat = os.stat(path)
    return {"JOURNAL_STREAM": f"{stat.st_dev}:{stat.st_ino}"}


def test_text_lines_with_timestamp_and_extras() -> None:
    out = io.StringIO()
    configure("info", "text", stream=out, environ={})
    logging.getLogger("streamd.access").info("stream closed", extra={"session_id": "s1", "finals": 3})
    logging.getLogger("streamd.engine").debug("hidden at info")
    line, = out.getvalue().splitlines()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO streamd.access: stream closed "
                        r"session_id=s1 finals=3", line)


def test_level_applies_to_every_streamd_logger() -> None:
    out = io.StringIO()
    configure("debug", "text", stream=out, environ={})
    for name in LOGGERS:
        logging.getLogger(name).debug("d")
    logging.getLogger("someone.else").info("not ours")
    logging.getLogger("someone.else").warning("theirs")
    lines = out.getvalue().splitlines()
    assert [line.split(" ")[3].rstrip(":") for line in lines[:4]] == list(LOGGERS)
    assert len(lines) == 5 and lines[-1].endswith("someone.else: theirs")


def test_access_off_silences_the_access_lines_only() -> None:
    out = io.StringIO()
    configure("debug", "text", access="off", stream=out, environ={})
    logging.getLogger("streamd.access").info("disconnect s-1")
    logging.getLogger("streamd.server").debug("connect s-1")
    logging.getLogger("streamd.access").warning("kept")
    set_levels("info", "on")  # a reload turns them on again
    logging.getLogger("streamd.access").info("disconnect s-2")
    logging.getLogger("streamd.server").debug("connect s-2")
    assert [line.split(": ", 1)[1] for line in out.getvalue().splitlines()] == [
        "connect s-1", "kept", "disconnect s-2"]


def test_json_lines() -> None:
    out = io.StringIO()
    configure("info", "json", stream=out, environ={})
    log = logging.getLogger("streamd.server")
    log.warning("slow step %d ms", 120, extra={"event": "slow_step", "remote": "10.0.0.1:5555"})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("failed")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert first.pop("ts").endswith("+00:00")
    assert first == {"level": "warning", "logger": "streamd.server", "message": "slow step 120 ms",
                     "event": "slow_step", "remote": "10.0.0.1:5555"}
    assert second["message"] == "failed" and "RuntimeError: boom" in second["exception"]


def test_journald_text_has_priority_and_no_timestamp(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    with path.open("w") as out:
        configure("debug", "text", stream=out, environ=journal_env(path))
        log = logging.getLogger("streamd.model")
        log.debug("d")
        log.info("loaded")
        log.warning("w")
        log.error("e")
        log.critical("c")
    assert path.read_text().splitlines() == [
        "<7>DEBUG streamd.model: d", "<6>INFO streamd.model: loaded", "<4>WARNING streamd.model: w",
        "<3>ERROR streamd.model: e", "<2>CRITICAL streamd.model: c"]


def test_journald_json_has_no_timestamp(tmp_path: Path) -> None:
    path = tmp_path / "journal"
    with path.open("w") as out:
        configure("info", "json", stream=out, environ=journal_env(path))
        logging.getLogger("streamd.server").info("up")
    assert json.loads(path.read_text()) == {"level": "info", "logger": "streamd.server",
                                            "message": "up"}


def test_under_journald_needs_the_same_file(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("")
    b.write_text("")
    with a.open("w") as stream:
        assert under_journald(stream, journal_env(a))
        assert not under_journald(stream, journal_env(b))
        assert not under_journald(stream, {})
        assert not under_journald(stream, {"JOURNAL_STREAM": "garbage"})
    assert not under_journald(io.StringIO(), journal_env(a))


def test_configure_twice_does_not_duplicate_lines() -> None:
    out = io.StringIO()
    configure("info", "text", stream=out, environ={})
    configure("info", "text", stream=out, environ={})
    logging.getLogger("streamd.server").info("once")
    assert len(out.getvalue().splitlines()) == 1


def test_python_warnings_are_logged() -> None:
    out = io.StringIO()
    configure("info", "text", stream=out, environ={})
    import warnings
    warnings.warn("deprecated thing", UserWarning, stacklevel=1)
    assert "py.warnings" in out.getvalue() and "deprecated thing" in out.getvalue()


def test_unknown_format() -> None:
    with pytest.raises(ValueError, match="unknown log format"):
        configure("info", "xml", stream=io.StringIO(), environ={})
