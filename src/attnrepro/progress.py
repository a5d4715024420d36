"""A progress bar that behaves under `dvc repro` and in CI logs (a line every 30 s there)."""

from __future__ import annotations

import sys
import time

from tqdm import tqdm


def progress(total: int, desc: str, unit: str = "it"):
    """A tqdm bar on a terminal; on a log (CI, redirected output) a plain line every 30 s."""
    if sys.stderr.isatty():
        return tqdm(total=total, desc=desc, unit=unit, mininterval=0.5, dynamic_ncols=True, file=sys.stderr)
    return LogProgress(total, desc, unit)


class LogProgress:
    """The part of tqdm's interface the stages use, printed as whole lines (logs have no \\r)."""

    def __init__(self, total: int, desc: str, unit: str = "it", every: float = 30.0):
        self.total, self.desc, self.unit, self.every = total, desc, unit, every
        self.n, self.postfix, self.t0 = 0, "", time.monotonic()
        self.last = self.t0

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self.last >= self.every:
            self.refresh()

    def set_postfix_str(self, text: str, refresh: bool = True) -> None:
        self.postfix = text

    def refresh(self) -> None:
        self.last = now = time.monotonic()
        elapsed = now - self.t0
        eta = f", ETA {_clock(elapsed * (self.total - self.n) / self.n)}" if 0 < self.n < self.total else ""
        pct = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        post = f", {self.postfix}" if self.postfix else ""
        print(f"{self.desc}: {self.n}/{self.total} {self.unit}s{pct}, {_clock(elapsed)} elapsed{eta}{post}",
              file=sys.stderr, flush=True)

    def write(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def close(self) -> None:
        self.refresh()


def _clock(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    return f"{m // 60}:{m % 60:02d}:{s:02d}" if m >= 60 else f"{m}:{s:02d}"
