"""Who may open a stream: the bearer token (header or ?token=), browser origins, and what the
daemon logs at INFO (never transcripts, audio or the token)."""
from __future__ import annotations

import asyncio
import json
import logging
import socket
from pathlib import Path
from typing import Any

import pytest
import soundfile as sf
import websockets

from conftest import FIXTURES
from daemon import config, running
from streamd.config import load_config
from streamd.errors import ConfigError
from streamd.server.app import App

TOKEN = "s3cret-Token_42"
START = json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le"})


async def status(url: str, path: str = "/v1/stream", **kw: Any) -> int:
    """101 when the handshake succeeds (and the stream answers `ready`), else the HTTP status."""
    try:
        async with websockets.connect(url + path, **kw) as ws:
            await ws.send(START)
            assert json.loads(await ws.recv())["type"] == "ready"
            return 101
    except websockets.InvalidStatus as e:
        return e.response.status_code


def rejected(app: App, reason: str) -> float:
    value = app.state.metrics.registry.get_sample_value("streamd_connections_rejected_total", {"reason": reason})
    return value or 0.0


def token_file(tmp_path: Path, text: str = TOKEN + "\n") -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    return path


def test_bearer_token_in_header_or_query(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(config(token_file=token_file(tmp_path))) as (app, url):
            assert await status(url) == 401
            try:
                await websockets.connect(url + "/v1/stream")
            except websockets.InvalidStatus as e:
                assert e.response.headers["WWW-Authenticate"] == 'Bearer realm="streamd"'
            for bad in ({"Authorization": "Bearer wrong"}, {"Authorization": TOKEN},
                        {"Authorization": f"Basic {TOKEN}"}, {"Authorization": f"Bearer {TOKEN}x"}):
                assert await status(url, additional_headers=bad) == 401, bad
            assert await status(url, "/v1/stream?token=wrong") == 401
            assert await status(url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) == 101
            assert await status(url, additional_headers={"Authorization": f"bearer  {TOKEN} "}) == 101
            assert await status(url, f"/v1/stream?token={TOKEN}") == 101
            assert rejected(app, "unauthorized") == 7
            # health, metrics and the page need no token
            for path in ("/livez", "/readyz", "/metrics", "/"):
                assert await asyncio.to_thread(_get, url, path) == 200

    asyncio.run(main())


def test_a_refused_token_is_logged_and_told_missing_or_wrong(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One WARNING line per 401 (never the token, offered or real); the body, and the bundled
    client's error, say whether no token came or a wrong one."""
    from streamd.clients.file import Options, transcribe_file
    wav = tmp_path / "a.wav"
    sf.write(wav, sf.read(str(FIXTURES / "in3_espeak_sentence.wav"), dtype="int16")[0], 16000)
    offered = "wr0ng-Tok3n"

    async def refusal(url: str, path: str = "/v1/stream", **kw: Any) -> tuple[int, str]:
        try:
            async with websockets.connect(url + path, **kw):
                return 101, ""
        except websockets.InvalidStatus as e:
            return e.response.status_code, e.response.body.decode()

    async def main() -> list[str]:
        async with running(config(token_file=token_file(tmp_path))) as (app, url):
            missing = [await refusal(url), await refusal(url, additional_headers={"Authorization": f"Basic {offered}"}),
                       await refusal(url, additional_headers={"Authorization": "Bearer "}),
                       await refusal(url, "/v1/stream?token=")]
            wrong = [await refusal(url, additional_headers={"Authorization": f"Bearer {offered}"}),
                     await refusal(url, f"/v1/stream?token={offered}")]
            assert all(s == 401 and b.startswith("no bearer token") for s, b in missing), missing
            assert all(s == 401 and b == "wrong bearer token\n" for s, b in wrong), wrong
            none = await transcribe_file(str(wav), Options(url))
            bad = await transcribe_file(str(wav), Options(url, token=offered))
            return [none.error or "", bad.error or ""]

    caplog.set_level(logging.INFO)
    none, bad = asyncio.run(main())
    assert "unauthorized: HTTP 401" in none and "needs a bearer token (--token-file)" in none, none
    assert "unauthorized: HTTP 401" in bad and "wrong bearer token" in bad, bad
    refused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused ")]
    assert len(refused) == 8 and all(r.levelno == logging.WARNING for r in caplog.records
                                     if r.getMessage().startswith("refused ")), refused
    assert sum("HTTP 401, no bearer token" in m for m in refused) == 5, refused
    assert sum("HTTP 401, wrong bearer token" in m for m in refused) == 3, refused
    assert all(m.startswith("refused /v1/stream from ") and "127.0.0.1" in m for m in refused), refused
    logged = "\n".join(r.getMessage() + " " + str(vars(r)) for r in caplog.records)
    assert offered not in logged and TOKEN not in logged


def _get(url: str, path: str) -> int:
    import urllib.request

    with urllib.request.urlopen(url.replace("ws", "http", 1) + path, timeout=10) as r:
        return int(r.status)


def _plain_get(url: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """A GET without a websocket upgrade: (status, body)."""
    import http.client

    host, port = url.removeprefix("ws://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, r.read().decode()
    finally:
        conn.close()


def test_a_plain_get_of_a_stream_path_tells_what_a_handshake_would_get(tmp_path: Path) -> None:
    """Browsers do not show why a websocket handshake failed, so the page asks first with a plain
    GET of the stream path: 401 with no token or a wrong one (told apart), 403 for an origin not
    allowed, 426 when a handshake would be let in. It opens nothing and takes no parked stream's
    slot (it evicted the parked stream of a full daemon)."""
    async def main() -> None:
        async with running(config(token_file=token_file(tmp_path), max_streams=1, resume_grace_s=30.0)) as (app, url):
            ws = await websockets.connect(url + "/v1/stream", additional_headers={"Authorization": f"Bearer {TOKEN}"})
            await ws.send(START)
            await ws.recv()
            ws.transport.abort()
            while app.state.sessions.parked != 1:
                await asyncio.sleep(0.01)
            own = {"Origin": url.replace("ws://", "http://")}
            for path in ("/v1/stream", "/v1/realtime", "/v1/listen?encoding=linear16&sample_rate=16000"):
                got = await asyncio.to_thread(_plain_get, url, path, own)
                assert got[0] == 401 and got[1].startswith("no bearer token"), (path, got)
                sep = "&" if "?" in path else "?"
                got = await asyncio.to_thread(_plain_get, url, f"{path}{sep}token=wrong", own)
                assert got == (401, "wrong bearer token\n"), (path, got)
                got = await asyncio.to_thread(_plain_get, url, f"{path}{sep}token={TOKEN}", {"Origin": "http://evil.example"})
                assert got[0] == 403, (path, got)
                got = await asyncio.to_thread(_plain_get, url, f"{path}{sep}token={TOKEN}", own)
                assert got == (426, "access granted: open this path with a websocket handshake\n"), (path, got)
            assert app.state.sessions.parked == 1 and len(app.state.live) == 1  # nothing opened, nothing evicted

    asyncio.run(main())


def test_browser_origins() -> None:
    async def main() -> None:
        async with running(config()) as (app, url):
            own = url.replace("ws://", "http://")
            assert await status(url) == 101  # no Origin: not a browser
            assert await status(url, origin=own) == 101
            assert await status(url, origin=own.upper() + "/") == 101
            for other in ("http://evil.example", own.replace("http", "https") + "1", "null"):
                assert await status(url, origin=other) == 403, other
            assert rejected(app, "origin") == 3
        async with running(config(allowed_origins=("https://app.example.com",))) as (app, url):
            assert await status(url, origin="https://app.example.com") == 101
            assert await status(url, origin="https://app.example.com:444") == 403
            assert await status(url, origin=url.replace("ws://", "http://")) == 101
        async with running(config(allowed_origins=("*",))) as (app, url):
            assert await status(url, origin="http://anywhere.example") == 101

    asyncio.run(main())


def test_wrong_origin_is_refused_even_with_the_token(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(config(token_file=token_file(tmp_path))) as (app, url):
            assert await status(url, f"/v1/stream?token={TOKEN}", origin="http://evil.example") == 403

    asyncio.run(main())


def test_access_settings(tmp_path: Path) -> None:
    cfg = load_config(environ={"STREAMD_ALLOWED_ORIGINS": "https://A.example/, http://b.example:8080",
                               "STREAMD_TOKEN_FILE": str(token_file(tmp_path))}, default_path=tmp_path / "none")
    assert cfg.server.allowed_origins == ("https://a.example", "http://b.example:8080")
    toml = tmp_path / "streamd.toml"
    toml.write_text('[server]\nallowed_origins = ["*"]\ntoken_file = "token"\n')
    cfg = load_config(environ={"STREAMD_CONFIG": str(toml)})
    assert cfg.server.allowed_origins == ("*",) and cfg.server.token_file == tmp_path / "token"
    for bad in ("ftp://x.example", "https://x.example/path", "example.com"):
        with pytest.raises(ConfigError, match="server.allowed_origins"):
            load_config(environ={"STREAMD_ALLOWED_ORIGINS": bad}, default_path=tmp_path / "none")
    toml.write_text("[server]\nallowed_origins = [1]\n")
    with pytest.raises(ConfigError, match="list of strings"):
        load_config(environ={"STREAMD_CONFIG": str(toml)})
    with pytest.raises(ConfigError, match="server.token_file: no such file"):
        load_config(environ={"STREAMD_TOKEN_FILE": str(tmp_path / "missing")}, default_path=tmp_path / "none")
    with pytest.raises(ValueError, match="stream token file .* is empty"):
        asyncio.run(_serve_briefly(config(token_file=token_file(tmp_path, " \n"))))


async def _serve_briefly(cfg: Any) -> None:
    async with running(cfg):
        pass


def test_info_logs_hold_no_transcript_audio_or_token(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pcm = sf.read(str(FIXTURES / "in3_espeak_sentence.wav"), dtype="int16")[0]

    async def main() -> list[str]:
        async with running(config(token_file=token_file(tmp_path))) as (app, url):
            out = await _stream_with_token(url, pcm.tobytes())
            await status(url, "/v1/stream?token=" + TOKEN + "x")  # a wrong token is not logged either
            return [m["text"] for m in out if m["type"] in ("partial", "final")] + \
                [p for m in out if m["type"] == "final" for p in m.get("tokens", [])]

    caplog.set_level(logging.INFO)
    texts = asyncio.run(main())
    words = {w for t in texts for w in t.split() if len(w) >= 6} | {t for t in texts if len(t) >= 12}
    assert words, "the stream produced no text to look for"
    logged = "\n".join(r.getMessage() + " " + str(vars(r)) for r in caplog.records)
    assert "connect" in logged and "disconnect" in logged
    leaked = sorted(w for w in words if w in logged)
    assert not leaked, f"transcript text in the logs: {leaked[:5]}"
    assert TOKEN not in logged
    assert repr(pcm[1000:1004].tobytes())[2:-1] not in logged


async def _stream_with_token(url: str, pcm: bytes) -> list[dict[str, Any]]:
    messages = []
    async with websockets.connect(url + "/v1/stream", additional_headers={"Authorization": f"Bearer {TOKEN}"}) as ws:
        await ws.send(json.dumps({"type": "start", "sample_rate": 16000, "encoding": "s16le", "word_times": True}))
        for i in range(0, len(pcm), 3200):
            await ws.send(pcm[i: i + 3200])
        await ws.send(json.dumps({"type": "stop"}))
        async for m in ws:
            messages.append(json.loads(m))
    return messages


def test_file_client_sends_the_token(tmp_path: Path) -> None:
    from streamd.clients.file import Options, transcribe_file

    wav = str(FIXTURES / "in2_chirp_1p23s.wav")

    async def main() -> None:
        async with running(config(token_file=token_file(tmp_path))) as (app, url):
            without = await transcribe_file(wav, Options(url))
            assert without.error is not None and "unauthorized" in without.error and "--token-file" in without.error
            assert rejected(app, "unauthorized") == 1  # not retried
            assert (await transcribe_file(wav, Options(url, token=TOKEN))).error is None

    asyncio.run(main())


def _handshake(url: str, headers: list[tuple[str, str]]) -> tuple[int, bytes]:
    """A websocket handshake with exactly `headers` (repeats included): the status and the body."""
    host, port = url.removeprefix("ws://").split(":")
    lines = ["GET /v1/stream HTTP/1.1", "Upgrade: websocket", "Connection: Upgrade",
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13",
             *(f"{k}: {v}" for k, v in headers)]
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        reply = b""
        while b"\r\n\r\n" not in reply or (not reply.startswith(b"HTTP/1.1 101") and not reply.endswith(b"\n")):
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    return int(reply.split(b" ", 2)[1]), reply.split(b"\r\n\r\n", 1)[1]


def test_duplicate_headers_get_400(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with running(config(token_file=token_file(tmp_path))) as (app, url):
            host = url.removeprefix("ws://")
            own, auth = url.replace("ws://", "http://"), f"Bearer {TOKEN}"
            cases = {"Origin": [("Host", host), ("Origin", own), ("Origin", own), ("Authorization", auth)],
                     "Host": [("Host", host), ("Host", host), ("Authorization", auth)]}
            for first, second in ((auth, "Bearer wrong"), ("Bearer wrong", auth)):
                cases[f"Authorization {first}"] = [("Host", host), ("Authorization", first), ("Authorization", second)]
            for name, headers in cases.items():
                status, body = await asyncio.to_thread(_handshake, url, headers)
                assert status == 400 and b"more than one" in body, (name, status, body)
            ok = await asyncio.to_thread(_handshake, url, [("Host", host), ("Origin", own), ("Authorization", auth)])
            assert ok[0] == 101
            assert rejected(app, "bad_request") == 4

    caplog.set_level(logging.INFO)
    asyncio.run(main())
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_dns_rebinding_is_refused() -> None:
    """A page on an attacker's name that resolves to the daemon is its own origin (`Host` and
    `Origin` agree), but the daemon does not serve that name: 403. Names it serves get in."""
    async def main() -> None:
        async with running(config()) as (app, url):
            port = url.rsplit(":", 1)[1]

            async def status(name: str) -> int:
                headers = [("Host", f"{name}:{port}"), ("Origin", f"http://{name}:{port}")]
                return (await asyncio.to_thread(_handshake, url, headers))[0]
            assert await status("rebind.attacker.example") == 403
            assert await status("127.0.0.1.nip.example") == 403
            for name in ("localhost", "127.0.0.1", "[::1]", "app.localhost", socket.gethostname().lower()):
                assert await status(name) == 101, name
        async with running(config(allowed_hosts=("stt.example.com", "*.corp.example"))) as (app, url):
            port = url.rsplit(":", 1)[1]
            for name, want in (("stt.example.com", 101), ("a.corp.example", 101), ("corp.example.evil", 403),
                               ("evil.example.com", 403)):
                got = (await asyncio.to_thread(_handshake, url, [("Host", f"{name}:{port}"),
                                                                 ("Origin", f"https://{name}:{port}".replace("https", "http"))]))[0]
                assert got == want, name

    asyncio.run(main())
