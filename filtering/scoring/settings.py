"""The one check of scoring's settings, shared by ``halsift score``, a recipe's ``score:`` section and library jobs
(:class:`~halsift.filtering.scoring.job.ScoreJob`); light to import."""

from __future__ import annotations

import os
from typing import Any

from halsift.corpus.errors import InputError
from halsift.filtering.scoring.guard import DEFAULT_MAX_PARSE_FAILURES


def check_settings(*, unit: str = "sentence", data: Any = None, batch_size: int = 1, decode_workers: int = 0,
                   max_parse_failures: float = DEFAULT_MAX_PARSE_FAILURES) -> None:
    """The one check of scoring's settings (``halsift score``, a recipe's ``score:`` section, library jobs): a
    ``ValueError`` naming the setting. Among them the rule that a bench file is scored per sentence (its rows)."""
    from halsift.corpus.units import UNITS
    from halsift.filtering.scoring.guard import check_rate

    check_rate(max_parse_failures)
    if unit not in UNITS:
        raise InputError(f"unit: expected one of {', '.join(UNITS)}, got {unit!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
    if isinstance(decode_workers, bool) or not isinstance(decode_workers, int) or decode_workers < 0:
        raise InputError(f"decode_workers: expected an integer >= 0, got {decode_workers!r}")
    if unit != "sentence" and is_bench(data):
        raise InputError(f"unit: a bench file ({data}) is scored per sentence (its rows); use unit sentence")


def is_bench(data: Any) -> bool:
    """Whether ``data`` names a bench file (``.jsonl``) rather than shards."""
    return isinstance(data, (str, os.PathLike)) and os.fspath(data).endswith(".jsonl")


__all__ = ["check_settings", "is_bench"]
