"""Progress bars that show throughput, and go quiet where they are noise (SLURM logs, HALSIFT_QUIET=1, ranks > 0)."""

from __future__ import annotations

import os
from collections.abc import Iterable

from tqdm.auto import tqdm


def quiet() -> bool:
    """True under SLURM batch jobs, with HALSIFT_QUIET=1, or on a non-zero distributed rank."""
    if os.environ.get("HALSIFT_QUIET", "") not in ("", "0"):
        return True
    if "SLURM_JOB_ID" in os.environ and os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        return True
    return int(os.environ.get("RANK", "0") or 0) > 0


def progress(iterable: Iterable | None = None, *, desc: str = "", unit: str = "it", total: int | None = None,
             **kw) -> tqdm:
    """A tqdm bar (rate shown as ``unit/s``) that is disabled by :func:`quiet`."""
    disable = kw.pop("disable", False)  # popped first: `quiet() or kw.pop(...)` left it in kw when quiet
    return tqdm(iterable, desc=desc, unit=unit, total=total, disable=quiet() or disable,
                dynamic_ncols=True, **kw)
