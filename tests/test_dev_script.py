"""`./dev serve` installs streamd into its venv once, not at every start (which took seconds and
failed offline with a complete venv); a changed pyproject.toml installs it again."""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

from conftest import REPO


def fake_venv(root: Path) -> Path:
    """A venv whose python has torch, whose pip and streamd log their calls."""
    bin_ = root / "venv" / "bin"
    bin_.mkdir(parents=True)
    scripts = {"python": "exit 0", "pip": f'echo "pip $*" >> {root}/calls', "streamd": f'echo "streamd $*" >> {root}/calls'}
    for name, body in scripts.items():
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(stat.S_IRWXU)
    return root / "venv"


def serve(checkout: Path, venv: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(checkout / "dev"), "serve", "--port", "0"], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "STREAMD_VENV": str(venv)})


def test_dev_serve_installs_once(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("dev", "pyproject.toml"):
        shutil.copy2(REPO / name, checkout / name)
    venv = fake_venv(tmp_path)
    for _ in range(2):
        assert serve(checkout, venv).returncode == 0
    calls = (tmp_path / "calls").read_text().splitlines()
    assert calls == ['pip install -q -e .[test]', 'streamd serve --port 0', 'streamd serve --port 0']
    with (checkout / "pyproject.toml").open("a") as f:
        f.write("\n# changed\n")
    assert serve(checkout, venv).returncode == 0
    assert (tmp_path / "calls").read_text().splitlines()[3:] == ['pip install -q -e .[test]', 'streamd serve --port 0']
