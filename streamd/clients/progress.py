"""A one-line progress bar (audio sent, files done) for terminals."""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TextIO

BAR_CHARS = 30
REDRAW_S = 0.1


class Progress:
    """Draws ``[#####-----]  42%  12.3/29.1 s  1/3 files`` on ``out``, rewritten in place.

    Disabled (draws nothing) unless ``enabled``; :meth:`clear` wipes the line so that other
    output can be printed, the next update draws it again.
    """

    def __init__(self, durations: Sequence[float], out: TextIO, enabled: bool) -> None:
        self.durations = list(durations)
        self.sent = [0.0] * len(durations)
        self.finished = 0
        self.out, self.enabled = out, enabled
        self._drawn_at = 0.0
        self._shown = False

    def update(self, index: int, seconds: float) -> None:
        """File ``index`` has sent ``seconds`` of audio (a retry may start it again at 0)."""
        self.sent[index] = seconds
        self._draw(force=False)

    def done(self, index: int) -> None:
        self.sent[index] = self.durations[index]
        self.finished += 1
        self._draw(force=True)

    def line(self) -> str:
        total = sum(self.durations) or 1.0
        fraction = min(1.0, sum(self.sent) / total)
        filled = round(fraction * BAR_CHARS)
        return (f"[{'#' * filled}{'-' * (BAR_CHARS - filled)}] {fraction:4.0%}  {sum(self.sent):.1f}/"
                f"{sum(self.durations):.1f} s  {self.finished}/{len(self.durations)} files")

    def clear(self) -> None:
        if self._shown:
            self.out.write("\r\x1b[K")
            self.out.flush()
            self._shown = False

    def _draw(self, force: bool) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._drawn_at < REDRAW_S):
            return
        self._drawn_at = now
        self.out.write("\r\x1b[K" + self.line())
        self.out.flush()
        self._shown = True
