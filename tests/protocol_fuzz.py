"""A seeded fuzzer of the streaming protocol, shared by the suite (tests/server/test_fuzz.py, bounded)
and the long run (scripts/fuzz_protocol.py).

`session(rng, max_bytes)` makes one connection's worth of client actions: a first message that is
a valid or mutated `start` (fields with wrong types, huge, negative, NaN, unicode; missing or
unknown fields; the JSON text itself damaged), audio or a control instead; then audio in odd sizes
and controls, and an ending: `stop`, a message after `stop`, a second `start`, text where audio is
expected, invalid UTF-8, an oversized frame, a NaN sample, silence until the idle timeout, or the
client closing or dropping the connection. Each session carries the endings docs/protocol.md
allows for it, worked out here from the documented rules (`start_faults`, `text_faults`), not from
the server's code; `problems()` checks what the server did against them and against the
documented close codes.
"""
from __future__ import annotations

import asyncio
import json
import math
import re
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import websockets

PROTOCOL_DOC = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"
CLEAN, CLIENT, ANY = "clean", "client", "any"  # endings besides error codes and bare closes
PV, UA = "protocol_violation", "unsupported_audio"
TOO_BIG = frozenset({"message_too_big", "close:1009"})
BAD_UTF8 = "close:1007"
MAX_ENDPOINT_MS = 3_600_000
ENDPOINT_KEYS = ("silence_after_speech_ms", "silence_without_speech_ms", "max_utterance_ms")
START_FIELDS = ("sample_rate", "encoding", "channels", "interim_results", "word_times", "endpointing")


def documented_errors(doc: Path = PROTOCOL_DOC) -> dict[str, int]:
    """Error code -> close code, from the "Error codes" table of docs/protocol.md."""
    section = doc.read_text().split("## Error codes", 1)[1].split("\n## ", 1)[0]
    return {code: int(close) for code, close in re.findall(r"^\| `(\w+)` \| (\d{4}) \|", section, re.M)}


@dataclass(frozen=True)
class Send:
    data: str | bytes
    text: bool  # a text frame; bytes sent as text need not be valid UTF-8


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class Close:
    code: int | None  # None: drop the TCP connection without a close frame


Action = Send | Pause | Close


@dataclass
class Session:
    label: str  # what the generator did, for reports
    actions: list[Action]
    expect: frozenset[str]  # acceptable endings: error codes, "close:N", CLEAN, CLIENT or ANY


@dataclass
class Outcome:
    messages: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None
    close_reason: str = ""
    sent: int = 0  # frames the client sent
    client_closed: bool = False
    hung: bool = False
    refused: str = ""  # the handshake failed: why
    binary: int = 0  # binary frames from the server (never expected)
    seconds: float = 0.0

    @property
    def ending(self) -> str:
        """CLIENT, CLEAN (summary after stop, 1000), an error code, or "close:N" without either."""
        if self.client_closed:
            return CLIENT
        last = self.messages[-1] if self.messages else {}
        if last.get("type") == "summary" and last.get("reason") == "stop" and self.close_code == 1000:
            return CLEAN
        if last.get("type") == "error":
            return str(last.get("code"))
        return f"close:{self.close_code}"


# -- the documented rules ---------------------------------------------------------------------------

def _typed(value: Any, kind: type) -> bool:
    return type(value) is kind  # JSON true/false are not integers, 16000.0 is not one


def start_faults(msg: dict[str, Any]) -> set[str]:
    """Every error a `start` object should cause (empty: valid); with several, any may come first."""
    faults: set[str] = set()
    if set(msg) - {"type", *START_FIELDS}:
        faults.add(PV)
    for key, kind, required, ok in (
            ("sample_rate", int, True, lambda v: 8000 <= v <= 48000),
            ("encoding", str, True, lambda v: v in ("s16le", "f32le")),
            ("channels", int, False, lambda v: 1 <= v <= 8),
            ("interim_results", bool, False, None),
            ("word_times", bool, False, None)):
        if key not in msg:
            faults |= {PV} if required else set()
        elif not _typed(msg[key], kind):
            faults.add(PV)
        elif ok is not None and not ok(msg[key]):
            faults.add(UA)
    rules = msg.get("endpointing", True)
    if not _typed(rules, bool) and not (
            _typed(rules, dict) and all(k in ENDPOINT_KEYS and _typed(v, int) and 0 <= v <= MAX_ENDPOINT_MS
                                        for k, v in rules.items())):
        faults.add(PV)
    return faults


def text_faults(text: str, first: bool) -> tuple[set[str], Any]:
    """The errors a text message should cause as the first message (`first`) or while streaming,
    and the message as parsed (None when it is not valid JSON)."""
    try:
        msg = json.loads(text)
    except (ValueError, RecursionError):  # deep nesting and 4300+ digit integers are malformed too
        return ({PV, UA} if re.search(r"\d{4300}", text) else {PV}), None
    if not isinstance(msg, dict) or msg.get("type") not in ("start", "stop", "keepalive", "finalize"):
        return {PV}, msg
    if msg["type"] == "start":  # a second start is out of order, and may be malformed as well
        return (start_faults(msg) if first else {PV} | start_faults(msg)), msg
    return ({PV} if first or len(msg) > 1 else set()), msg


# -- generating sessions --------------------------------------------------------------------------

WRONG_TYPES: tuple[Any, ...] = (
    None, True, False, 0.5, 16000.0, -0.0, "16000", "", [], [16000], {}, {"sample_rate": 16000},
    math.nan, math.inf, -math.inf, 1e308, -1e308, "\u202e\U0001F600\u0000", "\ud800", "x" * 3000,
)
BAD_INTS = (-1, 0, 7, 7999, 48001, 96000, 2**31, 2**63, 10**30, -(10**30), 10**400, -(10**400))
BAD_ENCODINGS = ("", "S16LE", "mulaw", "s16be", "s16le\u0000", "\U0001F600", "\ud800", "x" * 3000)
BAD_NAMES = ("sample_rte", "", "\u0000", "\U0001F600", "Type", "\ud800", "k" * 1000)
BAD_TYPES: tuple[Any, ...] = ("Start", "start ", "", "pause", "\U0001F600", None, 1, [], {}, True, "x" * 3000)
RATES = (8000, 11025, 16000, 22050, 44100, 48000)
JUNK = tuple('{}[]":,\\ 0123456789-.eEtrufalsnN\u00e9\U0001F600\u0000')


def _pick(rng: np.random.Generator, pool: tuple[Any, ...]) -> Any:
    return pool[int(rng.integers(len(pool)))]


def valid_start(rng: np.random.Generator) -> dict[str, Any]:
    msg: dict[str, Any] = {"type": "start",
                           "sample_rate": _pick(rng, RATES) if rng.random() < 0.8 else int(rng.integers(8000, 48001)),
                           "encoding": _pick(rng, ("s16le", "f32le"))}
    if rng.random() < 0.3:
        msg["channels"] = int(rng.integers(1, 9))
    for key in ("interim_results", "word_times"):
        if rng.random() < 0.3:
            msg[key] = bool(rng.random() < 0.5)
    if rng.random() < 0.3:
        msg["endpointing"] = _pick(rng, (True, False)) if rng.random() < 0.4 else {
            k: int(rng.integers(0, MAX_ENDPOINT_MS + 1)) for k in ENDPOINT_KEYS if rng.random() < 0.5}
    return msg


def mutated_start(rng: np.random.Generator) -> dict[str, Any]:
    """A start message with 1-3 fields made wrong (or, by chance, still right)."""
    msg = valid_start(rng)
    for _ in range(int(rng.integers(1, 4))):
        how = int(rng.integers(8))
        if how == 0:
            msg[_pick(rng, START_FIELDS)] = _pick(rng, WRONG_TYPES)
        elif how == 1:
            msg[_pick(rng, ("sample_rate", "channels"))] = _pick(rng, BAD_INTS)
        elif how == 2:
            msg["encoding"] = _pick(rng, BAD_ENCODINGS)
        elif how == 3:
            msg[_pick(rng, BAD_NAMES)] = _pick(rng, WRONG_TYPES)
        elif how == 4:
            msg.pop(_pick(rng, ("sample_rate", "encoding", "type")), None)
        elif how == 5:
            msg["type"] = _pick(rng, BAD_TYPES)
        elif how == 6:
            key = _pick(rng, ENDPOINT_KEYS + BAD_NAMES)
            msg["endpointing"] = {key: _pick(rng, BAD_INTS + WRONG_TYPES + (800,))}
        else:
            msg["endpointing"] = _pick(rng, (0, 1, "true", None, [], math.nan, "\U0001F600"))
    return msg


def damaged(rng: np.random.Generator, text: str) -> str:
    """Random character edits of a JSON text: the result may still be a valid message."""
    chars = list(text)
    for _ in range(int(rng.integers(1, 4))):
        i = int(rng.integers(len(chars) + 1))
        how = int(rng.integers(4))
        if how == 0 and chars:
            del chars[min(i, len(chars) - 1)]
        elif how == 1:
            chars.insert(i, _pick(rng, JUNK))
        elif how == 2 and chars:
            chars[min(i, len(chars) - 1)] = _pick(rng, JUNK)
        else:
            chars = chars[:i]
    return "".join(chars)


def hostile_text(rng: np.random.Generator) -> str:
    """Text no parser should choke on: deep nesting, giant numbers, huge unknown types, junk."""
    how = int(rng.integers(6))
    if how == 0:
        depth = int(rng.integers(500, 100_000))
        return "[" * depth + "]" * depth
    if how == 1:
        return '{"type":"start","sample_rate":' + "9" * int(rng.integers(4000, 20_000)) + ',"encoding":"s16le"}'
    if how == 2:
        return json.dumps({"type": "x" * int(rng.integers(1, 200_000))})
    if how == 3:
        return json.dumps(_pick(rng, (None, 1, -1e308, "start", [], [{"type": "start"}], True)))
    if how == 4:
        return "".join(_pick(rng, JUNK) for _ in range(int(rng.integers(0, 64))))
    return bytes(rng.integers(32, 127, int(rng.integers(1, 4000)), dtype=np.uint8)).decode()


def audio(rng: np.random.Generator, start: dict[str, Any], seconds: float, max_bytes: int) -> list[bytes]:
    """Random PCM in the start's format, cut into pieces of random (odd, too) sizes."""
    rate, channels = start["sample_rate"], start.get("channels", 1)
    width = 4 if start["encoding"] == "f32le" else 2
    n = int(min(seconds * rate * channels, 200_000 / width))
    if width == 4:
        data = (rng.standard_normal(n) * 0.1).astype("<f4").tobytes()
    else:
        data = rng.integers(-3000, 3000, n).astype("<i2").tobytes()
    pieces, i = [], 0
    while i < len(data):
        k = int(rng.integers(1, min(max_bytes, 16_000)))
        pieces.append(data[i: i + k])
        i += k
    return pieces


STOP, KEEPALIVE, FINALIZE = (json.dumps({"type": t}) for t in ("stop", "keepalive", "finalize"))


def _first(rng: np.random.Generator, max_bytes: int) -> tuple[str, Send, set[str], dict[str, Any] | None]:
    """The first frame: (label, frame, errors it should cause, the start if it is a valid one)."""
    roll = rng.random()
    if roll < 0.45:
        label, text = "start", json.dumps(valid_start(rng))
    elif roll < 0.75:
        label, text = "start_mutated", json.dumps(mutated_start(rng))
    elif roll < 0.85:
        label, text = "start_damaged", damaged(rng, json.dumps(valid_start(rng)))
    elif roll < 0.92:
        label, text = "hostile_first", hostile_text(rng)
    elif roll < 0.96:
        return "binary_first", Send(_pick(rng, (json.dumps(valid_start(rng)).encode(), b"\x00\x01", b"")), False), \
            {PV}, None
    else:
        return "control_first", Send(_pick(rng, (STOP, KEEPALIVE, FINALIZE)), True), {PV}, None
    if len(text.encode()) > max_bytes:
        return label, Send(text, True), set(TOO_BIG), None
    faults, msg = text_faults(text, first=True)
    return label, Send(text, True), faults, (msg if not faults else None)


def session(rng: np.random.Generator, max_bytes: int) -> Session:
    """One random session against a server whose max_message_bytes is `max_bytes`."""
    label, first, faults, start = _first(rng, max_bytes)
    if start is None:  # the first frame ends it; what follows is ignored or refused
        junk = [Send(b"\x00" * int(rng.integers(1, 999)), False), Send(STOP, True)][: int(rng.integers(3))]
        return Session(label, [first, *junk], frozenset(faults))
    actions: list[Action] = [first]
    sent = 0  # audio bytes so far
    for piece in audio(rng, start, float(rng.uniform(0.0, 1.5)), max_bytes):
        actions.append(Send(piece, False))
        sent += len(piece)
        roll = rng.random()
        if roll < 0.08:
            actions.append(Send(_pick(rng, (KEEPALIVE, FINALIZE)), True))
        elif roll < 0.1:
            actions.append(Pause(float(rng.uniform(0, 0.05))))
    end, expect = _ending(rng, start, sent, max_bytes)
    return Session(f"{label}/{_name(end, expect)}", actions + end, expect)


def _name(end: list[Action], expect: frozenset[str]) -> str:
    if not end:
        return "idle"
    if isinstance(end[-1], Close):
        return "client_close" if end[-1].code else "client_drop"
    return "+".join(sorted(expect))


def _ending(rng: np.random.Generator, start: dict[str, Any], sent: int,
            max_bytes: int) -> tuple[list[Action], frozenset[str]]:
    """The session's last actions and its acceptable endings."""
    stop = Send(STOP, True)
    how = int(rng.integers(10))
    if how == 0:
        late = _pick(rng, (STOP, KEEPALIVE, FINALIZE, json.dumps(start), b"\x01\x02\x03"))
        return [stop, Send(late, isinstance(late, str))], frozenset({PV, CLEAN})
    if how == 1:
        return [Send(json.dumps(valid_start(rng)), True), stop], frozenset({PV})
    if how == 2:  # text where audio is expected: PCM bytes (rarely UTF-8) or printable junk
        data = bytes(rng.integers(0, 256, int(rng.integers(1, 3000)), dtype=np.uint8))
        if rng.random() < 0.5:
            data = bytes(rng.integers(32, 127, len(data), dtype=np.uint8))
        try:
            faults, _ = text_faults(data.decode(), first=False)
            expect = frozenset(faults or {CLEAN})
        except UnicodeDecodeError:
            expect = frozenset({BAD_UTF8})
        return [Send(data, True), stop], expect
    if how == 3:
        text = hostile_text(rng)
        if len(text.encode()) > max_bytes:
            return [Send(text, True)], TOO_BIG
        faults, _ = text_faults(text, first=False)
        return [Send(text, True), stop], frozenset(faults or {CLEAN})
    if how == 4:
        size = int(rng.integers(max_bytes + 1, 2 * max_bytes + 2))
        return [Send(b"\x00" * size if rng.random() < 0.7 else "x" * size, False), stop], TOO_BIG
    if how == 5 and start["encoding"] == "f32le":
        frame = 4 * start.get("channels", 1)
        bad = struct.pack("<f", _pick(rng, (math.nan, math.inf, -math.inf))) * (frame // 4)
        return [Send(b"\x00" * (-sent % frame) + bad, False), stop], frozenset({UA})
    if how == 6:
        return [], frozenset({"idle_timeout"})
    if how == 7:
        return [Close(_pick(rng, (1000, 1001, 3000, 4999, None)))], frozenset({CLIENT})
    return [stop], frozenset({CLEAN})


# -- running and checking -------------------------------------------------------------------------

async def run(url: str, s: Session, deadline_s: float) -> Outcome:
    """Play session `s` against `url` (ws://host:port); a server that has not closed the connection
    `deadline_s` after the client's last frame counts as hung."""
    out, t0 = Outcome(), time.monotonic()
    try:
        ws = await asyncio.wait_for(websockets.connect(url + "/v1/stream", max_size=None), 30)
    except (OSError, TimeoutError, websockets.InvalidHandshake) as e:
        out.refused = f"{type(e).__name__}: {e}"
        return out
    reader = asyncio.create_task(_read(ws, out))
    try:
        for a in s.actions:
            if isinstance(a, Send):
                await ws.send(a.data, text=a.text)
                out.sent += 1
            elif isinstance(a, Pause):
                await asyncio.sleep(a.seconds)
            else:
                out.client_closed = True
                if a.code is None:
                    ws.transport.abort()
                else:
                    await ws.close(a.code)
                break
    except websockets.ConnectionClosed:
        pass
    try:
        await asyncio.wait_for(asyncio.shield(reader), deadline_s)
    except TimeoutError:
        out.hung = True
        ws.transport.abort()
        await reader
    out.seconds = time.monotonic() - t0
    return out


async def _read(ws: Any, out: Outcome) -> None:
    try:
        async for m in ws:
            if isinstance(m, bytes):
                out.binary += 1
            else:
                out.messages.append(json.loads(m))
    except websockets.ConnectionClosed:
        pass
    out.close_code, out.close_reason = ws.close_code, ws.close_reason or ""


def problems(s: Session, out: Outcome, errors: dict[str, int]) -> list[str]:
    """What the server did wrong in session `s` (empty: nothing), judged by the documented rules."""
    if out.refused:
        return [f"handshake refused: {out.refused}"]
    if out.hung:
        return ["hung: the server did not close the connection"]
    found = []
    if out.binary:
        found.append("binary frame from the server")
    if [m.get("seq") for m in out.messages] != list(range(len(out.messages))):
        found.append("seq not 0, 1, 2...")
    ends = [i for i, m in enumerate(out.messages) if m.get("type") in ("error", "summary")]
    if ends and ends != [len(out.messages) - 1]:
        found.append("a message after error or summary")
    for m in out.messages:
        if m.get("type") == "error":
            code = m.get("code")
            if code == "internal_error" or code not in errors:
                found.append(f"error code {code!r}: {str(m.get('message'))[:200]}")
            elif out.close_code is not None and not out.client_closed and out.close_code != errors[code]:
                found.append(f"{code} closed with {out.close_code}, documented {errors[code]}")
            elif not out.client_closed and not str(m.get("message", "")).startswith(out.close_reason):
                found.append("close reason is not the error message")
    if out.close_code == 1011:
        found.append("closed with 1011 (internal error)")
    ending = out.ending
    allowed = s.expect
    if ANY in allowed:
        allowed = frozenset({CLEAN, CLIENT, BAD_UTF8, *TOO_BIG, *errors}) - {"internal_error"}
    if ending not in allowed:
        found.append(f"ended {ending}, expected {' or '.join(sorted(allowed))}")
    return found
