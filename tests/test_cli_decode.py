"""`streamd decode` end to end, as a subprocess."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import FIXTURES
from helpers import reference

MODEL = FIXTURES / "tiny_streaming_fastconformer_hybrid.nemo"
WAVS = [FIXTURES / "in3_espeak_sentence.wav", FIXTURES / "in2_chirp_1p23s.wav"]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamd", "decode", *args], capture_output=True, text=True, timeout=300)


def test_streaming_and_offline_json_lines_match_nemo() -> None:
    ref = reference("hybrid")["offline"]
    for mode in ("--streaming", "--offline"):
        p = run(*map(str, WAVS), "--model", str(MODEL), "--att-context-size", "70,6", mode)
        assert p.returncode == 0, p.stderr
        lines = [json.loads(x) for x in p.stdout.splitlines()]
        assert [x["file"] for x in lines] == [str(w) for w in WAVS]
        for line, wav in zip(lines, WAVS):
            hyp = ref["att70_6"][wav.stem]["hyp"]
            assert line["tokens"] == hyp["tokens"].tolist()
            assert line["timestamps"] == hyp["timestamp"].tolist()
            assert line["text"] == hyp["text"]


def test_bad_arguments_are_clear_errors() -> None:
    p = run(str(WAVS[0]), "--model", str(MODEL), "--dtype", "int8")
    assert p.returncode == 2 and "unknown dtype" in p.stderr
    p = run(str(WAVS[0]), "--model", str(MODEL), "--att-context-size", "70,5")
    assert p.returncode == 2 and "not in" in p.stderr
