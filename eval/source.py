"""Where an evaluation's data comes from: the user's files named in its config, or the synthetic world's, built in
:mod:`halsift.synth` and passed in (the library never imports the synthetic world)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from halsift.corpus.config import ConfigError

D = TypeVar("D")


def check_source(synthetic: bool, files: Mapping[str, str], size_name: str, size: int) -> None:
    """Settings check of an eval that reads either the synthetic world (of ``size``) or all of ``files``
    (setting name -> path): not both, not neither, a positive size. Raises ValueError naming the setting."""
    if synthetic:
        if any(files.values()):
            raise ValueError(f"synthetic: give either synthetic or {'/'.join(files)}, not both")
        if size < 1:
            raise ValueError(f"{size_name}: must be >= 1, got {size}")
        return
    missing = [name for name, path in files.items() if not path]
    if missing:
        raise ValueError(f"{missing[0]}: give {' and '.join(files)} (or synthetic)")


def resolve_data(config: Any, data: D | None, load: Callable[[Any], D], builder: str) -> D:
    """``data`` when given, else what ``load(config)`` reads from the user's files; a synthetic config needs its
    data passed in (from ``builder`` in halsift.synth). Also checks that ``config.out`` is set."""
    if not config.out:
        raise ConfigError("out: an output folder is required")
    if data is not None:
        return data
    if config.synthetic:
        raise ConfigError(f"synthetic: the synthetic world's data comes from {builder} (passed as data); "
                          "`halsift eval ... --synthetic` and recipes wire it")
    return load(config)
