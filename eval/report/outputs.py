"""Small shared helpers for the I-HallA / VOPE / VIGIL reports: markdown tables, atomic writes, PNG plots."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from halsift.corpus.atomic import atomic_file, write_text_atomic
from halsift.corpus.percent import SCALE, SCALE_KEY, mark_percent
from halsift.corpus.shards import write_json_atomic
from halsift.eval.report.markdown import NA, fmt, md_table
from halsift.eval.result import EvalResult


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
                  plots: Sequence[tuple[str, Path]] = (), **files: Path) -> EvalResult:
    """Write ``metrics.json`` (marked ``"scale": 100``) and ``report.md`` (markdown lines + an embedded plot
    section) under ``out_dir``; ``files`` names the other outputs already written there (for the result)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    flat = mark_percent(flat_metrics(metrics))  # every share in it is a percentage
    write_json_atomic(out / "metrics.json", flat)
    lines = list(md)
    if plots:
        lines += ["## Plots", ""] + [f"### {t}\n\n![{t}](plots/{p.name})\n" for t, p in plots]
    report = write_text_atomic(out / "report.md", "\n".join(lines) + "\n")
    return EvalResult(flat, out, Path(report), out / "metrics.json", [p for _, p in plots], dict(files))


def with_scale_note(report: str, out_dir: str | os.PathLike) -> str:
    """``report`` (markdown) with a note under its first line when ``out_dir/metrics.json`` lacks
    ``"scale": 100`` (an earlier halsift's: its rates and F1 are shares, 0–1); as it is when marked or absent."""
    import json

    path = Path(out_dir) / "metrics.json"
    try:
        marked = json.loads(path.read_text()).get(SCALE_KEY) == SCALE
    except (OSError, ValueError, AttributeError):
        return report
    if marked:
        return report
    head, _, rest = report.partition("\n")
    return (f"{head}\n\n> Written by an earlier halsift (`{path}` has no `scale: 100`): its rates and F1 are shares "
            f"(0–1), not percentages; rerun the evaluation for percentages.\n{rest}")


__all__ = ["NA", "EvalResult", "fmt", "md_table", "write_text_atomic", "flat_metrics", "save_plot", "write_outputs",
           "with_scale_note"]
