"""The page served at `/`, in real headless Chromium with a fake microphone playing a WAV.

Chromium resamples the WAV to its audio context's rate, the page sends 16-bit PCM at that rate,
the daemon resamples it back: the gibberish transcript of the fixture model cannot be known in
advance. So the test checks that (1) the daemon received the WAV (correlation with the file),
(2) the page shows exactly the finals that the received audio gives, and (3) over TLS the page
switched to wss:// by itself.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import soundfile as sf

from chromium_cdp import launch
from client_support import PushRecorder, replay_finals, share_heard, speech
from daemon import config, running
from streamd.config import EndpointingConfig

CHROMIUM = shutil.which("chromium")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (apt-get install chromium)")

FINALS_JS = ("JSON.stringify([...document.querySelectorAll('.finals li')].map("
             "li => ({text: li.querySelector('.text').textContent, reason: li.dataset.reason})))")
SECTIONS_JS = ("JSON.stringify([...document.querySelectorAll('.session')].map(s => ({heading: "
               "s.querySelector('h3').textContent, texts: [...s.querySelectorAll('.text')].map(t => t.textContent)})))")
HEADING = re.compile(r"Session (\d+), \d{4}-\d\d-\d\d (\d\d:\d\d:\d\d) – (\d\d:\d\d:\d\d)")


def self_signed(tmp: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a certificate")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


@pytest.mark.parametrize("scheme", ["ws", "wss"])
def test_page_transcribes_the_microphone(tmp_path: Path, scheme: str) -> None:
    wav = tmp_path / "speech.wav"
    sf.write(wav, speech(pad_s=1.0), 16000, subtype="PCM_16")
    tls = dict(zip(("tls_cert", "tls_key"), self_signed(tmp_path))) if scheme == "wss" else {}
    flags = ["--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={wav}",
             "--use-fake-ui-for-media-stream", "--autoplay-policy=no-user-gesture-required"]
    if tls:
        flags.append("--ignore-certificate-errors")
    shots = Path(os.environ.get("STREAMD_SCREENSHOT_DIR", tmp_path))
    shot = shots / ("streamd-browser.png" if scheme == "ws" else "streamd-browser-wss.png")

    async def main() -> None:
        # endpoints on silence after speech, and at the latest every 3 s (the fixture model
        # sometimes babbles on silence)
        rules = EndpointingConfig(max_utterance_ms=3000)
        async with running(dataclasses.replace(config(**tls), endpointing=rules)) as (app, url):
            page_url = url.replace("ws", "https" if tls else "http", 1) + "/"
            received = PushRecorder(app)
            async with launch(str(CHROMIUM), tmp_path / "profile", flags, tmp_path / "chromium.log") as browser:
                page = await browser.new_page()
                await page.goto(page_url)
                assert await page.evaluate("document.body.dataset.state") == "idle"
                await page.evaluate("document.getElementById('toggle').click()", user_gesture=True)
                # the fake microphone loops the WAV: wait for two finals, and for two loops of
                # audio, so that one whole copy lies in what the daemon received
                await page.wait_for("document.querySelectorAll('.finals li').length >= 2", timeout=90)
                loop = len(speech(pad_s=1.0))
                for _ in range(300):
                    if received.samples() >= 2 * loop:
                        break
                    await asyncio.sleep(0.1)
                await page.screenshot(shot)
                assert await page.evaluate("document.body.dataset.endpoint") == \
                    f"{'wss' if tls else 'ws'}://{page_url.split('/')[2]}/v1/stream"
                await page.evaluate("document.getElementById('toggle').click()", user_gesture=True)
                status = await page.wait_for(
                    "['closed', 'error'].includes(document.body.dataset.state) && document.body.dataset.state", 30)
                assert status == "closed", await page.evaluate("document.getElementById('status').textContent")
                shown = json.loads(await page.evaluate(FINALS_JS))
            audio = received.stop()
            heard = share_heard(audio, speech(pad_s=0.0))
            assert heard >= 0.75, f"the daemon did not receive the WAV ({heard:.0%} of its pieces found)"
            cafile = str(tls["tls_cert"]) if tls else None
            expected = await replay_finals(url.replace("ws", scheme, 1), audio, cafile)
            assert len(shown) >= 2 and all(f["text"] for f in shown)
            assert shown == [{"text": f.text, "reason": f.reason} for f in expected]

    asyncio.run(main())
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_page_separates_sessions_shows_the_level_and_copies_and_downloads(tmp_path: Path) -> None:
    """Two streams from one page: a section each with its times, the level meter moving while
    listening, and the transcript (a heading and one line per utterance per session) copied to
    the clipboard and downloaded as .txt."""
    wav = tmp_path / "speech.wav"
    sf.write(wav, speech(pad_s=1.0), 16000, subtype="PCM_16")
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    flags = ["--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={wav}",
             "--use-fake-ui-for-media-stream", "--autoplay-policy=no-user-gesture-required"]
    click = "document.getElementById({!r}).click()".format
    level = "document.getElementById('level').value"

    async def main() -> tuple[list[dict[str, Any]], str, str, list[Path]]:
        rules = EndpointingConfig(max_utterance_ms=3000)
        async with running(dataclasses.replace(config(), endpointing=rules)) as (app, url):
            origin = url.replace("ws", "http", 1)
            async with launch(str(CHROMIUM), tmp_path / "profile", flags, tmp_path / "chromium.log") as browser:
                await browser.send("Browser.grantPermissions", {
                    "origin": origin, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]})
                await browser.send("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
                page = await browser.new_page()
                await page.send("Emulation.setFocusEmulationEnabled", enabled=True)  # the clipboard wants focus
                await page.goto(origin + "/")
                assert await page.evaluate("document.getElementById('copy').disabled") is True
                assert await page.evaluate(level) == -60
                for n in (1, 2):
                    await page.evaluate(click("toggle"), user_gesture=True)
                    await page.wait_for(f"document.querySelectorAll('.session:nth-child({n}) .finals li').length", 90)
                    assert -45 < await page.wait_for(f"{level} > -45 && {level}", 30) <= 0
                    await page.evaluate(click("toggle"), user_gesture=True)
                    await page.wait_for("document.body.dataset.state === 'closed'", 30)
                    assert await page.evaluate(level) == -60  # the meter rests when nothing is recorded
                sections = json.loads(await page.evaluate(SECTIONS_JS))
                await page.evaluate(click("copy"), user_gesture=True)
                await page.wait_for("document.getElementById('copy').textContent === 'Copied'", 10)
                copied = await page.evaluate("navigator.clipboard.readText()", user_gesture=True)
                await page.evaluate(click("download"), user_gesture=True)
                for _ in range(100):
                    if (saved := list(downloads.glob("*.txt"))):
                        break
                    await asyncio.sleep(0.1)
                return sections, copied, await page.evaluate("transcriptText()"), saved

    sections, copied, text, saved = asyncio.run(main())
    assert len(sections) == 2
    for n, section in enumerate(sections, 1):
        heading = HEADING.fullmatch(section["heading"])
        assert heading and int(heading[1]) == n and heading[2] <= heading[3], section["heading"]
        assert section["texts"] and all(section["texts"])
    assert text == "\n".join("\n".join([s["heading"], *s["texts"]]) + "\n" for s in sections)
    assert copied == text
    assert len(saved) == 1 and re.fullmatch(r"streamd-\d{4}-\d\d-\d\d-\d{6}\.txt", saved[0].name), saved
    assert saved[0].read_text(encoding="utf-8") == text


def test_page_says_why_no_stream_opens(tmp_path: Path) -> None:
    """A draining daemon and a daemon gone are told apart from a missing microphone."""
    wav = tmp_path / "speech.wav"
    sf.write(wav, speech(pad_s=1.0), 16000, subtype="PCM_16")
    flags = ["--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={wav}",
             "--use-fake-ui-for-media-stream", "--autoplay-policy=no-user-gesture-required"]
    status_js = "document.getElementById('status').textContent"

    async def main() -> None:
        async with running(config()) as (app, url):
            async with launch(str(CHROMIUM), tmp_path / "profile", flags, tmp_path / "chromium.log") as browser:
                page = await browser.new_page()
                await page.goto(url.replace("ws", "http", 1) + "/")
                app.control.drain()
                await page.evaluate("document.getElementById('toggle').click()", user_gesture=True)
                await page.wait_for("document.body.dataset.state === 'error'", 30)
                said = await page.evaluate(status_js)
                assert "draining" in said and "Microphone" not in said, said
                app.state.shutdown.set()  # the daemon goes away; the page stays open
                for _ in range(100):  # until its port is closed
                    try:
                        _, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
                    except OSError:
                        break
                    writer.close()
                    await asyncio.sleep(0.1)
                await page.evaluate("document.getElementById('toggle').click()", user_gesture=True)
                await page.wait_for(f"document.body.dataset.state === 'error' && {status_js} !== {json.dumps(said)}", 30)
                said = await page.evaluate(status_js)
                assert "Cannot reach the server" in said and "Microphone" not in said, said

    asyncio.run(main())


def test_page_says_whether_its_token_is_missing_or_wrong(tmp_path: Path) -> None:
    """A daemon with a token: the page opened without one, or with a wrong one, says which (a
    browser cannot read a refused handshake's 401); with the right one it listens."""
    wav = tmp_path / "speech.wav"
    sf.write(wav, speech(pad_s=1.0), 16000, subtype="PCM_16")
    token = tmp_path / "token"
    token.write_text("s3cret-Token_42\n")
    flags = ["--use-fake-device-for-media-stream", f"--use-file-for-fake-audio-capture={wav}",
             "--use-fake-ui-for-media-stream", "--autoplay-policy=no-user-gesture-required"]
    status_js = "document.getElementById('status').textContent"

    async def said(browser: Any, page_url: str, state: str) -> str:
        page = await browser.new_page()
        await page.goto(page_url)
        await page.evaluate("document.getElementById('toggle').click()", user_gesture=True)
        await page.wait_for(f"document.body.dataset.state === '{state}'", 30)
        return str(await page.evaluate(status_js))

    async def main() -> None:
        async with running(config(token_file=token)) as (_, url):
            home = url.replace("ws", "http", 1) + "/"
            async with launch(str(CHROMIUM), tmp_path / "profile", flags, tmp_path / "chromium.log") as browser:
                missing = await said(browser, home, "error")
                assert "needs a token" in missing and "/?token=TOKEN" in missing, missing
                wrong = await said(browser, home + "?token=guess", "error")
                assert "refused the token" in wrong and "wrong bearer token" in wrong, wrong
                assert "Microphone" not in missing + wrong
                await said(browser, home + "?token=s3cret-Token_42", "listening")

    asyncio.run(main())
