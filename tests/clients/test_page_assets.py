"""The browser page's files as the daemon serves them: the controls the script uses exist, the
scripts parse (with Node.js where installed), and nothing is fetched from elsewhere."""
from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from daemon import config, running

PAGE_FILES = ("/", "/app.js", "/capture-worklet.js")


def served() -> dict[str, str]:
    async def main() -> dict[str, str]:
        async with running(config()) as (_, url):
            base = url.replace("ws", "http", 1)
            return {path: await asyncio.to_thread(_get, base + path) for path in PAGE_FILES}

    return asyncio.run(main())


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode("utf-8"))


def test_page_has_the_controls_its_script_uses_and_fetches_nothing_from_elsewhere(tmp_path: Path) -> None:
    files = served()
    html, script = files["/"], files["/app.js"]
    ids = set(re.findall(r'\bid="([^"]+)"', html))
    assert {"toggle", "level", "status", "copy", "download", "sessions", "partial"} <= ids
    used = set(re.findall(r"\$\('([^']+)'\)", script))
    assert used and used <= ids, used - ids
    for text in files.values():
        assert not re.search(r"(https?:)?//[a-z0-9.-]+\.[a-z]{2,}", text, re.I), "the page must not load anything from elsewhere"
    node = shutil.which("node")
    if node is None:
        pytest.skip("no node to check that the scripts parse")
    for path in ("/app.js", "/capture-worklet.js"):
        js = tmp_path / path.lstrip("/")
        js.write_text(files[path])
        check = subprocess.run([node, "--check", str(js)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
