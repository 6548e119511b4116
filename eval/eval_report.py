"""Small shared helpers for the I-HallA / VOPE / VIGIL reports: markdown tables, atomic writes, PNG plots."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from ..corpus.shards import write_json_atomic
from .report import _table as md_table  # one table renderer for every report

from halsift.corpus.atomic import atomic_file, write_text_atomic

NA = "n/a"


def fmt(v: float | None, digits: int = 3) -> str:
    """A number for a markdown cell; None/NaN -> 'n/a'."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return NA
    return f"{v:.{digits}f}"


def flat_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """Metrics as plain floats (NaN kept as None so that metrics.json stays valid JSON)."""
    out: dict[str, float] = {}
    for k, v in metrics.items():
        f = float(v)
        out[k] = f if math.isfinite(f) else None
    return out


def save_plot(out_dir: Path, name: str, draw: Callable, figsize: tuple[float, float] = (7, 4)) -> Path:
    """Draw a matplotlib figure with ``draw(fig, ax)`` and save it atomically as ``out_dir/plots/name``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots = out_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=figsize)
    draw(fig, ax)
    fig.tight_layout()
    path = plots / name
    with atomic_file(path, ".png") as tmp:
        fig.savefig(tmp, dpi=90)
    plt.close(fig)
    return path


def write_outputs(out_dir: str | os.PathLike, metrics: Mapping[str, float], md: Sequence[str],
                  plots: Sequence[tuple[str, Path]] = ()) -> Path:
    """Write ``metrics.json`` and ``report.md`` (markdown lines + an embedded plot section) under ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / "metrics.json", flat_metrics(metrics))
    lines = list(md)
    if plots:
        lines += ["## Plots", ""] + [f"### {t}\n\n![{t}](plots/{p.name})\n" for t, p in plots]
    return write_text_atomic(out / "report.md", "\n".join(lines) + "\n")


__all__ = ["NA", "fmt", "md_table", "write_text_atomic", "flat_metrics", "save_plot", "write_outputs"]
