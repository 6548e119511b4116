"""Declared value ranges: one interval syntax, one parser and one message for every setting
(``field(..., range=...)``, :mod:`halsift.corpus.config`) and every detector option (a family's ``OPTION_RANGES``,
:mod:`halsift.filtering.detectors.spec`).

An interval is ``[lo, hi]``, with ``(`` / ``)`` for an open end. A bound is a number or ``inf`` / ``-inf``; NaN lies
in no interval and an infinity only in one closed at it, so ``(0, inf)`` reads "a finite number above 0". A *size*
interval has a size bound (``16MB``) or ``RAM`` (this machine's memory: physical, or the cgroup limit when lower);
its values are text that DuckDB reads as a size, parsed once into bytes by :func:`byte_size`.
"""

from __future__ import annotations

import functools
import math
import os
import re
from pathlib import Path
from typing import Any, NamedTuple

# the units DuckDB's memory settings take (its parser: KB..TB are 1000^i, KiB..TiB 1024^i), case-insensitive
SIZE_UNITS = {"b": 1, "byte": 1, "bytes": 1, "kb": 10 ** 3, "mb": 10 ** 6, "gb": 10 ** 9, "tb": 10 ** 12,
              "kilobyte": 10 ** 3, "kilobytes": 10 ** 3, "megabyte": 10 ** 6, "megabytes": 10 ** 6,
              "gigabyte": 10 ** 9, "gigabytes": 10 ** 9, "terabyte": 10 ** 12, "terabytes": 10 ** 12,
              "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)\s*", re.IGNORECASE)
_INTERVAL = re.compile(r"\s*([\[(])\s*(-?[\w.]+)\s*,\s*(-?[\w.]+)\s*([\])])\s*")
RAM = "RAM"  # a size bound: this machine's memory


class Interval(NamedTuple):
    """A parsed interval: its bounds, whether each end is closed, and whether it holds sizes (bytes)."""

    lo: float
    lo_closed: bool
    hi: float
    hi_closed: bool
    sized: bool

    def holds(self, value: float) -> bool:
        """Whether the number ``value`` lies in the interval (NaN never does)."""
        above = value >= self.lo if self.lo_closed else value > self.lo
        below = value <= self.hi if self.hi_closed else value < self.hi
        return bool(above and below)


def machine_memory() -> int:
    """This machine's memory in bytes: the physical memory, or the cgroup's limit when it is lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def byte_size(text: str) -> int:
    """A size as DuckDB writes it (``512MB``, ``2 GiB``, ``1.5gb``) in bytes; ``ValueError`` for anything else (a bare
    number, an exponent, an unknown unit)."""
    m = _SIZE.fullmatch(text) if isinstance(text, str) else None
    unit = SIZE_UNITS.get(m.group(2).lower()) if m else None
    if unit is None:
        raise ValueError(f"expected a size such as 512MB or 2GiB (a number and one of KB, MB, GB, TB, or KiB, MiB, "
                         f"GiB, TiB), got {text!r}")
    return int(float(m.group(1)) * unit)


def _bound(token: str) -> tuple[float, bool]:
    """``(value, is a size)`` of an interval bound."""
    if token == RAM:
        return float(machine_memory()), True
    try:
        return float(token), False
    except ValueError:
        return float(byte_size(token)), True


@functools.lru_cache(maxsize=None)
def parse_interval(interval: str) -> Interval:
    """``"[1, inf)"`` -> :class:`Interval`; ``ValueError`` when the text is not an interval."""
    m = _INTERVAL.fullmatch(interval)
    if m is None:
        raise ValueError(f"not an interval: {interval!r}")
    try:
        (lo, lo_size), (hi, hi_size) = _bound(m.group(2)), _bound(m.group(3))
    except ValueError:
        raise ValueError(f"not an interval: {interval!r}") from None
    return Interval(lo, m.group(1) == "[", hi, m.group(4) == "]", lo_size or hi_size)


def in_interval(value: float, interval: str) -> bool:
    """``value`` lies in ``interval`` (``[lo, hi]``, ``(``/``)`` open ends, ``inf``); NaN lies in none."""
    return parse_interval(interval).holds(value)


def _human(n: float) -> str:
    """Bytes as a reader reads them (``23.5 GiB``, ``9.8 KiB``)."""
    unit = next((u for u in ("TiB", "GiB", "MiB", "KiB") if n >= 2 ** (10 * ("KMGT".index(u[0]) + 1))), None)
    return f"{n / 2 ** (10 * ('KMGT'.index(unit[0]) + 1)):.1f} {unit}" if unit else f"{int(n)} bytes"


def range_problem(value: Any, interval: str) -> str | None:
    """What is wrong with ``value`` for ``interval`` ("expected a value in [1, inf), got 0"), or None when it lies
    there. Numbers are checked against a number interval (booleans and other types are left to the type check),
    size text against a size interval; a list is checked item by item."""
    if isinstance(value, (list, tuple)):
        bad = next((p for p in (range_problem(v, interval) for v in value) if p), None)
        return f"{bad} (in {list(value)!r})" if bad else None
    iv = parse_interval(interval)
    if iv.sized:
        if not isinstance(value, str):
            return None
        try:
            n = byte_size(value)
        except ValueError as e:
            return str(e)
        if iv.holds(n):
            return None
        ram = f" ({RAM}: this machine's memory, {_human(machine_memory())})" if RAM in interval else ""
        return f"expected a size in {interval}{ram}, got {value!r} ({_human(n)})"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or iv.holds(value):
        return None
    finite = "a finite value" if not math.isfinite(value) else "a value"
    return f"expected {finite} in {interval}, got {value!r}"


__all__ = ["Interval", "RAM", "SIZE_UNITS", "byte_size", "in_interval", "machine_memory", "parse_interval",
           "range_problem"]
