"""What every evaluation returns: its flat metrics and the files it wrote under its output folder."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class EvalResult:
    """Metrics (the content of ``metrics.json``) and the paths an evaluation wrote."""

    metrics: dict[str, float | None]
    out: Path  # the output folder (``config.out``)
    report: Path  # report.md
    metrics_file: Path  # metrics.json
    plots: list[Path] = field(default_factory=list)  # plots/*.png
    files: dict[str, Path] = field(default_factory=dict)  # other outputs by name (index.html, findings.jsonl, ...)
    summary: str = ""  # one line for the console
