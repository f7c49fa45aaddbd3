"""Live migration through the admin API while real clients stream; admin authentication."""
from __future__ import annotations

import asyncio
import os
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from daemon import config, running, stream_pcm
from streamd.admin_client import AdminError, check_socket, request
from streamd.config import AdminConfig
from streamd.engine.recognizer import Recognizer
from test_daemon import WAVS, pcm_of

N_STREAMS = 16


async def admin(sock: Path, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    return await asyncio.to_thread(request, method, path, body, socket_path=sock)


async def streams_with_migrations(sock: Path, url: str, moves: list[str | None]) -> tuple[list[Any], list[dict[str, Any]]]:
    """16 paced streams (about 4 s each, so that a loaded machine still moves them mid-stream); the moves
    (dtype names) happen one after another while they run."""
    jobs = [asyncio.create_task(stream_pcm(url, pcm_of(WAVS[i % len(WAVS)]), np.random.default_rng(i),
                                           max_piece=3000, pace_s=0.06)) for i in range(N_STREAMS)]
    reports = []
    for dtype in moves:
        await asyncio.sleep(0.15)
        status, body = await admin(sock, "POST", "/v1/migrate", {"device": "cpu", "dtype": dtype})
        assert status == 200 and body["ok"], body
        if body["migration"]["moved"]:
            assert body["migration"]["streams"] > 0  # the move happened mid-stream
        reports.append(body["migration"])
    return list(await asyncio.gather(*jobs)), reports


def test_migrations_mid_stream_lose_nothing(tmp_path: Path) -> None:
    sock = tmp_path / "admin.sock"

    async def main() -> None:
        async with running(config(admin=AdminConfig(socket=sock))) as (app, url):
            baseline, _ = await streams_with_migrations(sock, url, [])
            same, reports = await streams_with_migrations(sock, url, ["fp32"])
            assert reports[0]["moved"] is False and reports[0]["pause_ms"] == 0.0  # already there
            mixed, moves = await streams_with_migrations(sock, url, ["bf16", "fp32", "bf16", "fp32"])
            status, body = await admin(sock, "GET", "/v1/status")
            assert body["dtype"] == "fp32" and body["last_migration"]["ok"]
            assert body["encoder"] == "eager" and body["decoder"] == "eager"  # graphs on, but on the CPU
            assert body["attention"] == "explicit"  # the Triton kernel and SDPA are CUDA's
            assert body["calls"] > 0 and body["eager_calls"] == {"encoder": body["calls"], "decoder": body["calls"]}
            for run in (same, mixed):
                for t in run:
                    assert t.close_code == 1000 and t.messages[-1]["type"] == "summary"
                    assert t.of("final")  # every stream got its finals
                    assert t.messages[-1]["audio_seconds"] == pytest.approx(
                        t.of("final")[-1]["audio_processed"], abs=1e-3)  # all audio was decoded
            for a, b in zip(baseline, same):
                assert a.pieces == b.pieces  # an fp32 -> fp32 move changes nothing
            agree = [sum(x == y for x, y in zip(a.pieces, b.pieces)) / max(len(a.pieces), 1)
                     for a, b in zip(baseline, mixed)]
            print(f"bf16 periods: positional token agreement with fp32 mean {np.mean(agree):.2f}, "
                  f"pauses {[round(r['pause_ms'], 1) for r in moves]} ms")
            text = app.state.metrics.render().decode()
            assert 'streamd_migrations_total{result="ok"} 4.0' in text  # fp32 -> fp32 moves do nothing
            calls = {(s.labels["part"], s.labels["path"]): s.value for family in text_string_to_metric_families(text)
                     if family.name == "streamd_engine_calls" for s in family.samples if s.name.endswith("_total")}
            assert calls[("encoder", "graphs")] == calls[("decoder", "graphs")] == 0.0  # every call eager on the CPU
            assert calls[("encoder", "eager")] == calls[("decoder", "eager")] > 0

    asyncio.run(main())


def test_failed_migrations_roll_back_and_streams_continue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sock = tmp_path / "admin.sock"
    import streamd.engine.migration as migration
    import streamd.engine.probes as probes

    async def main() -> None:
        async with running(config(admin=AdminConfig(socket=sock))) as (app, url):
            baseline, _ = await streams_with_migrations(sock, url, [])
            jobs = [asyncio.create_task(stream_pcm(url, pcm_of(WAVS[i % len(WAVS)]), np.random.default_rng(i),
                                                   max_piece=3000, pace_s=0.06)) for i in range(N_STREAMS)]
            await asyncio.sleep(0.1)
            status, body = await admin(sock, "POST", "/v1/migrate", {"device": "cuda:7"})
            assert status == 409 and not body["ok"] and "cuda" in body["migration"]["error"]
            assert (body["device"], body["dtype"]) == ("cpu", "fp32")

            real_move = migration.move_model

            def out_of_memory(*args: Any) -> None:
                raise torch.OutOfMemoryError("simulated: out of memory while copying weights")

            monkeypatch.setattr(migration, "move_model", out_of_memory)
            status, body = await admin(sock, "POST", "/v1/migrate", {"dtype": "bf16"})
            assert status == 409 and "simulated" in body["migration"]["error"]
            monkeypatch.setattr(migration, "move_model", real_move)

            def probe_fails(rec: Any) -> None:
                raise RuntimeError("simulated: first step on the target failed")

            real_probe = probes.silent_chunk

            monkeypatch.setattr(probes, "silent_chunk", probe_fails)
            status, body = await admin(sock, "POST", "/v1/migrate", {"dtype": "bf16"})
            assert status == 409 and "first step" in body["migration"]["error"]
            assert body["dtype"] == "fp32"
            monkeypatch.setattr(probes, "silent_chunk", real_probe)

            real_state = Recognizer.state_tensors

            def state_once_fails(self: Any) -> Any:
                if self.model.dtype == torch.bfloat16:  # only the conversion to the bf16 target
                    raise torch.OutOfMemoryError("simulated: out of memory converting stream state")
                return real_state(self)

            monkeypatch.setattr(Recognizer, "state_tensors", state_once_fails)
            status, body = await admin(sock, "POST", "/v1/migrate", {"dtype": "bf16"})
            monkeypatch.setattr(Recognizer, "state_tensors", real_state)
            assert status == 409 and "converting stream state" in body["migration"]["error"]
            assert body["dtype"] == "fp32"
            after = await asyncio.gather(*jobs)
            for a, b in zip(baseline, after):
                assert b.close_code == 1000 and a.pieces == b.pieces
            assert 'streamd_migrations_total{result="failed"} 4.0' in app.state.metrics.render().decode()

    asyncio.run(main())


def test_admin_auth(tmp_path: Path) -> None:
    sock = tmp_path / "admin.sock"
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")

    async def main() -> None:
        import socket as socketlib
        with socketlib.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cfg = config(admin=AdminConfig(socket=sock, port=port, token_file=token))
        async with running(cfg) as (app, url):
            assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
            tcp = f"http://127.0.0.1:{port}"
            for bad in (None, "wrong"):
                status, body = await asyncio.to_thread(request, "POST", "/v1/migrate", {"dtype": "bf16"}, url=tcp, token=bad)
                assert status == 401 and not body["ok"]
            status, body = await asyncio.to_thread(request, "GET", "/v1/status", url=tcp, token="s3cret-token")
            assert status == 200 and body["dtype"] == "fp32"
            # the socket refuses peers with another uid
            import streamd.server.admin as admin_mod
            real = admin_mod.peer_uid
            admin_mod.peer_uid = lambda s: 12345  # type: ignore[assignment]
            try:
                status, body = await admin(sock, "GET", "/v1/status")
                assert status == 401
            finally:
                admin_mod.peer_uid = real
            # the client refuses a socket others can use
            os.chmod(sock, 0o666)
            with pytest.raises(AdminError, match="permissions"):
                check_socket(sock)
            # the streaming port has no admin routes
            import urllib.error
            import urllib.request
            def post() -> int:
                try:
                    urllib.request.urlopen(url.replace("ws", "http") + "/v1/migrate", data=b"{}", timeout=5)
                except urllib.error.HTTPError as e:
                    return e.code
                except ConnectionError:
                    return 0  # the websocket server drops a non-GET request
                return 200
            assert await asyncio.to_thread(post) != 200

    asyncio.run(main())
