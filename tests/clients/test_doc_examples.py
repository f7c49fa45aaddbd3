"""The Python examples of README.md and docs/protocol.md, run as written (only the daemon's URL
changed) against a real daemon with the shipped model, on the same speech as 16-bit, 24-bit, 8-bit
and float WAVs: each prints the sentence for every sample format, and ends by itself."""
from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from conftest import REPO
from daemon import config, running

SENTENCE = "please call me back in ten minutes"
SUBTYPES = ("PCM_16", "PCM_24", "PCM_U8", "FLOAT", "DOUBLE")
EXAMPLES = {  # name: (file, the text just before its ```python block)
    "readme": ("README.md", "Python, in a dozen lines:"),
    "protocol": ("docs/protocol.md", "## Example client (Python)"),
    "openai": ("docs/protocol.md", "### Example (the `openai` Python SDK)"),
}


def example(name: str) -> str:
    doc, heading = EXAMPLES[name]
    text = (REPO / doc).read_text()
    block = re.search(r"```python\n(.*?)```", text[text.index(heading):], re.S)
    assert block is not None, f"no python block after {heading!r} in {doc}"
    return block[1]


def wavs(tmp_path: Path) -> dict[str, Path]:
    """espeak-ng's sentence (served by the shipped model) in every sample format."""
    spoken = tmp_path / "espeak.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(spoken), SENTENCE], check=True)
    audio, rate = sf.read(str(spoken), dtype="float32")  # floats: written scaled in every format
    audio = np.concatenate([audio, np.zeros(2 * rate, np.float32)])  # the utterance ends before the file
    out = {}
    for subtype in SUBTYPES:
        out[subtype] = tmp_path / subtype / "speech.wav"
        out[subtype].parent.mkdir()
        sf.write(out[subtype], audio, rate, subtype=subtype)
    return out


async def run_example(code: str, url: str, wav: Path) -> str:
    script = wav.parent / "example.py"
    script.write_text(code.replace("ws://127.0.0.1:8765", url))
    proc = await asyncio.create_subprocess_exec(sys.executable, str(script), wav.name, cwd=wav.parent,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    except TimeoutError:
        proc.kill()
        raise AssertionError(f"the example did not end: {script}") from None
    assert proc.returncode == 0, err.decode()
    return out.decode()


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")
@pytest.mark.parametrize("name", EXAMPLES)
def test_documented_example_reads_every_sample_format(tmp_path: Path, name: str) -> None:
    code, files = example(name), wavs(tmp_path)

    async def main() -> None:
        async with running(config(model=None)) as (_, url):
            outs = await asyncio.gather(*(run_example(code, url, files[s]) for s in SUBTYPES))
        # lines of text; protocol.md's example also prints the `ready` message
        texts = {s: " ".join(line for line in o.splitlines() if not line.startswith("{")) for s, o in zip(SUBTYPES, outs)}
        assert texts == {s: SENTENCE for s in SUBTYPES}
        assert not [o for o in outs if "" in o.splitlines()], "an example printed an empty final"

    asyncio.run(main())
