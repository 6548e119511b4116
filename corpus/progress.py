"""Progress: tqdm bars on a terminal; one line every ``HALSIFT_PROGRESS_EVERY`` seconds (default 60) in logs.

A bar is a tqdm when stderr is a terminal and nothing asks for quiet. In a log (stderr not a terminal, a SLURM
batch job, ``HALSIFT_QUIET=1``) a bar is a :class:`LineProgress` instead: the same ``update`` / ``close`` /
``set_postfix`` calls, printing a plain line such as ``score task 3/8: 12,040 sent, 210.4 sent/s, parts=5/40``
at most once per interval and once at the end (tqdm in a file is carriage-return noise, or nothing until the end).
Non-zero distributed ranks stay silent; ``disable=True`` (``--no-progress``) silences everything.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable

from tqdm.auto import tqdm


def quiet() -> bool:
    """True under SLURM batch jobs, with HALSIFT_QUIET=1, or on a non-zero distributed rank."""
    if os.environ.get("HALSIFT_QUIET", "") not in ("", "0"):
        return True
    if "SLURM_JOB_ID" in os.environ and os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        return True
    return _rank() > 0


def _rank() -> int:
    return int(os.environ.get("RANK", "0") or 0)


def _every() -> float:
    try:
        return max(0.0, float(os.environ.get("HALSIFT_PROGRESS_EVERY", "60")))
    except ValueError:
        return 60.0


def _fmt_s(s: float) -> str:
    s = int(s)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


class LineProgress:
    """tqdm's ``update`` / ``close`` / ``set_postfix`` / iteration, logged as one line per ``every`` seconds."""

    def __init__(self, iterable: Iterable | None = None, *, desc: str = "", unit: str = "it", total: int | None = None,
                 initial: int = 0, every: float | None = None, stream=None) -> None:
        self.iterable, self.desc, self.unit, self.total = iterable, desc, unit, total
        self.n, self.start_n = initial, initial
        self.every = _every() if every is None else every
        self.stream = stream
        self.t0 = self.last = time.monotonic()
        self.postfix = ""
        self.closed = False

    def __iter__(self):
        for x in self.iterable:
            yield x
            self.update(1)
        self.close()

    def __enter__(self) -> "LineProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def set_postfix(self, **kw) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in kw.items())

    def line(self) -> str:
        dt = max(time.monotonic() - self.t0, 1e-9)
        rate = (self.n - self.start_n) / dt
        text = f"{self.desc}: {self.n:,} {self.unit}, {rate:.1f} {self.unit}/s, elapsed {_fmt_s(dt)}"
        if self.total:
            eta = (self.total - self.n) / rate if rate > 0 else float("inf")
            text += f", {100 * self.n / self.total:.1f}% of {self.total:,}"
            text += f", ETA {_fmt_s(eta)}" if eta != float("inf") else ""
        return text + (f", {self.postfix}" if self.postfix else "")

    def _log(self) -> None:
        print(self.line(), file=self.stream or sys.stderr, flush=True)
        self.last = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        if time.monotonic() - self.last >= self.every:
            self._log()

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        if not self.closed and self.n > self.start_n and time.monotonic() - self.t0 >= self.every:
            self._log()  # a final line, unless the whole run was shorter than one interval
        self.closed = True


def progress(iterable: Iterable | None = None, *, desc: str = "", unit: str = "it", total: int | None = None,
             **kw) -> tqdm | LineProgress:
    """A tqdm bar (rate shown as ``unit/s``) on a terminal, a :class:`LineProgress` in a log, or a silent bar when
    ``disable`` is given or on a non-zero rank."""
    disable = kw.pop("disable", False)  # popped first: `quiet() or kw.pop(...)` left it in kw when quiet
    if not disable and _rank() == 0 and (quiet() or not sys.stderr.isatty()):
        return LineProgress(iterable, desc=desc, unit=unit, total=total, initial=kw.get("initial", 0))
    return tqdm(iterable, desc=desc, unit=unit, total=total, disable=quiet() or disable,
                dynamic_ncols=True, **kw)
