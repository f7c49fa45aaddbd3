"""A real daemon on port 0 with real websocket clients."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest
import soundfile as sf

from conftest import FIXTURES
from daemon import TINY, config, running, stream_pcm
from helpers import fixture_model

WAVS = sorted(FIXTURES.glob("in*.wav"))


def pcm_of(path: object) -> bytes:
    data, sr = sf.read(str(path), dtype="int16")
    assert sr == 16000
    return data.tobytes()


async def fetch(url: str, path: str) -> tuple[int, str]:
    """GET on the daemon's port from a worker thread (the server runs on this event loop)."""
    def get() -> tuple[int, str]:
        try:
            with urllib.request.urlopen(url.replace("ws", "http", 1) + path, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
    return await asyncio.to_thread(get)


def decode_reference() -> dict[str, list[str]]:
    """What `streamd decode --streaming` gives: the tokens every daemon stream must reproduce."""
    p = subprocess.run([sys.executable, "-m", "streamd", "decode", "--model", str(TINY), *map(str, WAVS)],
                       capture_output=True, text=True, timeout=300, check=True)
    tok = fixture_model("rnnt").tokenizer
    return {json.loads(x)["file"]: [tok.id_to_piece(i) for i in json.loads(x)["tokens"]] for x in p.stdout.splitlines()}


def test_many_concurrent_streams_match_decode_streaming() -> None:
    ref = decode_reference()

    async def main() -> None:
        async with running(config(max_streams=40)) as (app, url):
            jobs = [stream_pcm(url, pcm_of(WAVS[i % len(WAVS)]), np.random.default_rng(i)) for i in range(36)]
            results = await asyncio.gather(*jobs)
            for i, t in enumerate(results):
                wav = str(WAVS[i % len(WAVS)])
                assert t.close_code == 1000
                assert t.messages[0]["type"] == "ready" and t.messages[-1]["type"] == "summary"
                assert [m["seq"] for m in t.messages] == list(range(len(t.messages)))
                assert t.pieces == ref[wav], (i, wav)
                finals = t.of("final")
                assert [f["utterance"] for f in finals] == list(range(len(finals)))
                assert t.messages[-1]["utterances"] == len(finals)
                # partials only grow within an utterance, and a final settles each one
                for u in range(len(finals)):
                    texts = [m["text"] for m in t.messages if m["type"] == "partial" and m["utterance"] == u]
                    assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), texts
                    assert all(finals[u]["text"].startswith(x) for x in texts)
            metrics = (await fetch(url, "/metrics"))[1]
            assert "streamd_batch_size_count" in metrics
            batch_sum = float(next(l.split()[1] for l in metrics.splitlines() if l.startswith("streamd_batch_size_sum")))
            batch_n = float(next(l.split()[1] for l in metrics.splitlines() if l.startswith("streamd_batch_size_count")))
            assert batch_sum / batch_n > 1.5  # streams really were batched together

    asyncio.run(main())


def test_health_endpoints_and_capacity_limit() -> None:
    async def main() -> None:
        async with running(config(max_streams=2)) as (app, url):
            assert (await fetch(url, "/livez"))[0] == 200
            assert (await fetch(url, "/readyz"))[0] == 200
            import websockets

            a = await websockets.connect(url + "/v1/stream")
            b = await websockets.connect(url + "/v1/stream")
            with pytest.raises(websockets.InvalidStatus) as exc:
                await websockets.connect(url + "/v1/stream")
            assert exc.value.response.status_code == 503
            assert exc.value.response.headers["Retry-After"] == "1"
            await a.close()
            await b.close()

    asyncio.run(main())


def test_a_daemon_whose_engine_thread_fails_exits_with_an_error(caplog: pytest.LogCaptureFixture) -> None:
    """The engine thread dies on an unexpected error (a bug): the daemon does not go on accepting
    streams it can never answer; it logs the traceback and `serve` ends with `EngineDied` (the CLI
    exits 2, and systemd's Restart=on-failure starts it again)."""
    from streamd.errors import EngineDied
    from streamd.server.metrics import Metrics
    from streamd.server.app import App, build_state

    class Broken:
        def send(self, messages: list[object]) -> None:
            raise RuntimeError("a bug on the engine thread")

    async def main() -> None:
        app = App(build_state(config(), Metrics(process=False)))
        started: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        task = asyncio.create_task(app.serve(started))
        await asyncio.wait_for(started, 60)
        app.state.engine.send(Broken(), [])  # type: ignore[arg-type]
        with pytest.raises(EngineDied, match="a bug on the engine thread"):
            await asyncio.wait_for(task, 30)

    asyncio.run(main())
    assert any(r.levelname == "CRITICAL" and "engine thread stopped" in r.getMessage() for r in caplog.records)


def test_an_engine_thread_failing_during_warm_up_ends_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine thread dies before serving (while the warm-up waits for it): `serve` ends with
    `EngineDied` at once instead of waiting for an answer that never comes."""
    from streamd.engine.engine import Engine
    from streamd.errors import EngineDied
    from streamd.server.app import App, build_state
    from streamd.server.metrics import Metrics

    def broken(self: Engine) -> None:
        raise RuntimeError("a bug at start")

    monkeypatch.setattr(Engine, "_serve", broken)

    async def main() -> None:
        app = App(build_state(config(), Metrics(process=False)))
        with pytest.raises(EngineDied, match="a bug at start"):
            await asyncio.wait_for(app.serve(), 30)

    asyncio.run(main())
