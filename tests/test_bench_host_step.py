"""`scripts/bench_host_step.py` runs against the engine as it is: its no-op encoder and decoder
stand in for the real ones (a missing attribute broke it once, unnoticed), directly and through
front-end processes."""
from __future__ import annotations

import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.parametrize("extra", [[], ["--queued-only", "--front-ends", "2"]], ids=["direct", "front-ends"])
def test_the_host_step_bench_steps_and_reports(extra: list[str]) -> None:
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_host_step.py"), "--streams", "24",
                          "--chunk-ms", "160", "--piece-ms", "80", "--steps", "3", *extra],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "24 streams, 160 ms chunks" in out.stdout and "us a stream, median: audio in" in out.stdout
