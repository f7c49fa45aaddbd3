"""Where the TTS engines live and how to call them: system-installed, or under an unpacked root.

A root is the folder that `engines.sh` makes (Debian packages unpacked with `dpkg -x`); with no
root the system binaries and data (Debian's paths) are used.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ARCH_LIB = "usr/lib/x86_64-linux-gnu"
FLITE_PREFIX = "flite_cmu_us_"


@dataclass(frozen=True)
class TTS:
    """Paths of the engines under `root` ('/' for the system ones)."""

    root: Path = Path("/")

    @property
    def portable(self) -> bool:
        """True when the engines come from an unpacked root rather than the system."""
        return self.root != Path("/")

    def bin(self, name: str) -> str:
        """Path of an engine binary."""
        return str(self.root / "usr/bin" / name)

    @property
    def espeak_ng_data(self) -> Path:
        return self.root / ARCH_LIB / "espeak-ng-data"

    @property
    def espeak_data(self) -> Path:
        return self.root / ARCH_LIB / "espeak-data"

    @property
    def festival_lib(self) -> Path:
        return self.root / "usr/share/festival"

    def env(self) -> dict[str, str]:
        """Environment for the engine processes (libraries and data of the root)."""
        env = dict(os.environ)
        if self.portable:
            libs = [self.root / ARCH_LIB, self.root / "lib/x86_64-linux-gnu",
                    self.root / ARCH_LIB / "pulseaudio"]
            env["LD_LIBRARY_PATH"] = ":".join(
                [str(p) for p in libs] + [p for p in [env.get("LD_LIBRARY_PATH")] if p])
            env["ESPEAK_DATA_PATH"] = str(self.root / ARCH_LIB)
            env["HOME"] = "/tmp"
        return env

    def espeak_ng_cmd(self, voice: str, wpm: int, pitch: int, text: str, out: Path) -> list[str]:
        return [self.bin("espeak-ng"), "-v", voice, "-s", str(wpm), "-p", str(pitch),
                "-w", str(out), "--", text]

    def espeak_cmd(self, voice: str, wpm: int, pitch: int, text: str, out: Path) -> list[str]:
        path = ["--path=" + str(self.root / ARCH_LIB)] if self.portable else []
        return [self.bin("espeak"), *path, "-v", voice, "-s", str(wpm), "-p", str(pitch),
                "-w", str(out), "--", text]

    def flite_cmd(self, voice: str, stretch: float, f0_mean: float | None, text: str,
                  out: Path) -> list[str]:
        f0 = ["--setf", f"int_f0_target_mean={f0_mean:.0f}"] if f0_mean is not None else []
        return [self.bin(FLITE_PREFIX + voice), "--setf", f"duration_stretch={stretch:.3f}", *f0,
                "-t", text, "-o", str(out)]

    def festival_cmd(self, script: Path) -> list[str]:
        lib = ["--libdir", str(self.festival_lib), "--datadir", str(self.festival_lib)]
        return [self.bin("festival"), *(lib if self.portable else []), "-b", str(script)]

    def espeak_ng_variants(self) -> list[str]:
        """Variant file names (case as on disk) of espeak-ng; names with spaces are left out."""
        return _variant_files(self.espeak_ng_data / "voices" / "!v")

    def espeak_variants(self) -> list[str]:
        """Variant file names of espeak 1.48."""
        return _variant_files(self.espeak_data / "voices" / "!v")

    def flite_voices(self) -> list[str]:
        """Flite voices that have their own binary (flite_cmu_us_NAME)."""
        bindir = self.root / "usr/bin"
        if not bindir.is_dir():
            return []
        return sorted(p.name[len(FLITE_PREFIX):] for p in bindir.glob(FLITE_PREFIX + "*"))

    def festival_voices(self) -> list[str]:
        """Festival voices installed (voices/LANGUAGE/NAME)."""
        return sorted(p.name for p in (self.festival_lib / "voices").glob("*/*") if p.is_dir())

    def installed(self, binary: str) -> bool:
        """Whether an engine binary is there."""
        return Path(self.bin(binary)).is_file()


def _variant_files(folder: Path) -> list[str]:
    if not folder.is_dir():
        return []
    return sorted((p.name for p in folder.iterdir() if p.is_file() and re.fullmatch(r"\S+", p.name)),
                  key=str.lower)
