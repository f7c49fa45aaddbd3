"""Run a real daemon in-process on port 0 for tests, and a minimal protocol client."""
from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import websockets

from conftest import FIXTURES
from streamd.config import AdminConfig, Config, EngineConfig, GateConfig, ServerConfig
from streamd.server.app import App, build_state
from streamd.server.metrics import Metrics

TINY = FIXTURES / "tiny_streaming_fastconformer_rnnt.nemo"


def config(model: Path | None = TINY, admin: AdminConfig | None = None, gate: str = "off", **server: Any) -> Config:
    """A test daemon on port 0, CPU; `model=None` serves the shipped default model. The speech gate
    is off: tests compare the daemon's tokens with the recognizer's, on fixtures of tones and noise
    (tests/server/test_speech_gate.py tests the gate). Admission by max_streams: a CI machine
    under load may rightly estimate its capacity below a test's streams (test_admission tests
    admission by capacity)."""
    base = dict(port=0, max_streams=64, idle_timeout_s=10.0, resume_grace_s=1.0, admission="max_streams")
    base.update(server)
    return Config(server=ServerConfig(**base), engine=EngineConfig(model=model, device="cpu"),
                  gate=GateConfig(mode=gate), admin=admin or AdminConfig(socket=None))


@contextlib.asynccontextmanager
async def running(cfg: Config) -> AsyncIterator[tuple[App, str]]:
    app = App(build_state(cfg, Metrics(process=False)))
    started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(app.serve(started))
    port = await asyncio.wait_for(started, 60)
    try:
        yield app, f"ws://127.0.0.1:{port}"
    finally:
        app.state.shutdown.set()
        await asyncio.wait_for(task, 60)


@dataclass
class Transcript:
    messages: list[dict[str, Any]] = field(default_factory=list)
    close_code: int | None = None

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m["type"] == kind]

    @property
    def results(self) -> list[dict[str, Any]]:
        """Partials and finals without the fields that depend on timing (seq, audio_processed)."""
        return [{k: v for k, v in m.items() if k not in ("seq", "audio_processed")} for m in self.messages
                if m["type"] in ("partial", "final")]

    @property
    def pieces(self) -> list[str]:
        return [t for f in self.of("final") for t in f.get("tokens", [])]


async def stream_pcm(url: str, pcm: bytes, rng: np.random.Generator, start: dict[str, Any] | None = None,
                     max_piece: int = 8000, pace_s: float = 0.0) -> Transcript:
    """Send start, PCM in random-size frames, stop; collect every server message."""
    out = Transcript()
    async with websockets.connect(url + "/v1/stream", max_size=None) as ws:
        await ws.send(json.dumps(start or {"type": "start", "sample_rate": 16000, "encoding": "s16le", "word_times": True}))
        reader = asyncio.create_task(read_all(ws, out))
        i = 0
        while i < len(pcm):
            k = int(rng.integers(1, max_piece))
            await ws.send(pcm[i: i + k])
            i += k
            if pace_s:
                await asyncio.sleep(pace_s)
        await ws.send(json.dumps({"type": "stop"}))
        await reader
    return out


async def read_all(ws: Any, out: Transcript) -> Transcript:
    """Collect every server message until the server closes."""
    try:
        async for m in ws:
            out.messages.append(json.loads(m))
    except websockets.ConnectionClosed:
        pass
    out.close_code = ws.close_code
    return out
