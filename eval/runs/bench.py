"""``run_bench``: the AlignBench / HalDec-Bench sentence-level detection evaluation of score folders and detector
specs, with ensembles, self-preference, the likelihood analysis, report, plots and ``index.html``
(:func:`halsift.eval.runs.bench_eval.evaluate_bench` computes and writes; this gathers the scores it reads)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halsift.corpus.config import ConfigError, field
from halsift.eval.result import EvalResult


@dataclass
class BenchEvalConfig:
    bench: str = field("", help="bench.jsonl (one annotated sentence per row)")
    scores: list[str] = field(default_factory=list,
                              help="score folder(s) or parquet file(s) of the bench (key = row id, sentence_index = "
                                   "position); a folder holding several detectors is split by its 'detector' column")
    detector: list[str] = field(default_factory=list,
                                help="detector spec(s) to score the bench with first (scores go to OUT/scores/<name>)")
    out: str = field("", help="output folder for metrics.json, report.md and plots/")
    keep: float = field(0.2, range="(0, 1]", help="share kept for precision@keep (HalDec Fig. 8)")
    self_preference: list[str] = field(default_factory=list,
                                       help="DET=GEN pairs: the generator that is the detector's own model (Fig. 8)")
    ensemble: list[str] = field(default_factory=list,
                                help="ensembles to report: detector names joined by '+' (mean of their scores, "
                                     "Table 6)")
    likelihood: str = field("", help="vlm detector spec: add the likelihood analysis (HalDec Fig. 7), each "
                                     "sentence's log-likelihood given its own vs a random image, by position and "
                                     "label (likelihood/... metrics, a report table, plots/likelihood.png, "
                                     "likelihood.csv)")
    likelihood_images: int = field(0, range="[0, inf)",
                                   help="likelihood: only the rows of N images (a sample seeded by seed; "
                                        "0 = all)")
    n_boot: int = field(1000, range="[10, inf)", help="bootstrap replicates for the 95-percent CIs")
    seed: int = field(0, range="[0, inf)", help="bootstrap seed")
    plots: bool = field(True, help="write the PNG plots")
    html: bool = field(True, help="write index.html (the report with a browser of the bench's captions, opened "
                                  "from disk)")

    def validate(self) -> None:
        if not self.bench:
            raise ValueError("bench: required")
        if not self.scores and not self.detector:
            raise ValueError("scores/detector: give score folders (scores) or detector specs (detector) to evaluate")
        self.self_preference_map()
        if self.likelihood_images < 0 or 0 < self.likelihood_images < 2:
            raise ValueError(f"likelihood_images: {self.likelihood_images}, expected at least 2 (a random image "
                             "must differ from the own one) or 0 (all)")
        if self.likelihood_images and not self.likelihood:
            raise ValueError("likelihood_images: needs likelihood (a vlm spec)")

    def self_preference_map(self) -> dict[str, str]:
        """``self_preference`` as detector -> generator."""
        mapping = {}
        for pair in self.self_preference:
            det, sep, gen = pair.partition("=")
            if not sep or not det or not gen:
                raise ValueError(f"self_preference: {pair!r} is not DETECTOR=GENERATOR")
            mapping[det] = gen
        return mapping


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "_", name).strip("_") or "detector"


def load_scores(paths: list[str]) -> dict[str, Any]:
    """Score tables by detector name: one per folder/file, or one per ``detector`` value of a mixed folder."""
    from halsift.corpus.scores import read_scores_df

    out = {}
    for path in paths:
        df = read_scores_df(path)
        names = sorted(df["detector"].dropna().unique()) if "detector" in df.columns else []
        groups = [(n, df[df["detector"] == n]) for n in names] if len(names) > 1 else \
            [(names[0] if names else Path(path).stem, df)]
        for name, part in groups:
            if name in out:
                raise ConfigError(f"scores: {path}: detector {name!r} appears in more than one score folder")
            out[name] = part.reset_index(drop=True)
    return out


def score_with_detectors(specs: list[str], bench: str, out_dir: Path) -> dict[str, Any]:
    """Score the bench with each spec into ``out_dir/scores/<name>``; score tables by detector name."""
    import pandas as pd

    from halsift.corpus.scores import read_scores_df
    from halsift.filtering.scoring.runner import score_bench
    from halsift.filtering.detectors.spec import load_detector

    out = {}
    for spec in specs:
        detector = load_detector(spec)
        name = str(getattr(detector, "name", spec))
        folder = out_dir / "scores" / _safe(name)
        result = score_bench(detector, bench, folder)
        out[name] = result if isinstance(result, pd.DataFrame) else read_scores_df(
            result if isinstance(result, (str, Path)) else folder)
    return out


def likelihood_analysis(spec: str, bench: str, out_dir: Path, seed: int, max_images: int | None):
    """The likelihood table of a ``vlm`` detector on the bench, also written as ``likelihood.csv``."""
    from halsift.corpus.atomic import write_text_atomic
    from halsift.eval.metrics.likelihood import likelihood_table
    from halsift.filtering.detectors.spec import load_detector

    judge = load_detector(spec).vlm_judge("--likelihood")  # MissingCapability: one line (exit 2 from the CLI)
    try:
        table = likelihood_table(judge, bench, seed=seed, max_images=max_images)
    except ValueError as e:
        raise ConfigError(f"likelihood: {e}") from None
    write_text_atomic(out_dir / "likelihood.csv", table.to_csv(index=False))
    return table


def _summary(metrics: dict, names: list[str]) -> str:
    several = len(names) > 1
    lines = []
    for name in names:
        key = f"{name}/auroc/mean" if several else "auroc/mean"
        lo, hi = (f"{name}/auroc_lo/mean", f"{name}/auroc_hi/mean") if several else ("auroc_lo/mean", "auroc_hi/mean")
        if key in metrics:
            lines.append(f"{name}: AUROC mean {metrics[key]:.1f} [{metrics.get(lo, float('nan')):.1f}, "
                         f"{metrics.get(hi, float('nan')):.1f}]")
    return "\n".join(lines)


def run_bench(config: BenchEvalConfig, data: Mapping[str, Any] | None = None) -> EvalResult:
    """Gather the scores (score folders, then detectors scored here), evaluate them on the bench and write
    ``metrics.json``, ``report.md``, plots and ``index.html`` to ``config.out``. ``data``: score tables by detector
    name already read (a recipe's score stage's), used instead of reading ``config.scores``."""
    from halsift.eval.metrics.agreement import AgreementError
    from halsift.eval.runs.bench_eval import evaluate_bench
    from halsift.eval.metrics.detection import MetricError

    if not config.out:
        raise ConfigError("out: an output folder is required")
    if not Path(config.bench).exists():
        raise ConfigError(f"bench: {config.bench} does not exist")
    out_dir = Path(config.out)
    scores = dict(data) if data is not None else load_scores(config.scores)
    if config.detector:
        for name, df in score_with_detectors(config.detector, config.bench, out_dir).items():
            if name in scores:
                raise ConfigError(f"detector: {name!r} is also given by scores")
            scores[name] = df
    likelihood = None
    if config.likelihood:
        likelihood = likelihood_analysis(config.likelihood, config.bench, out_dir, config.seed,
                                         config.likelihood_images or None)
    try:
        metrics = evaluate_bench(config.bench, scores, out_dir, keep=config.keep,
                                 self_pref_map=config.self_preference_map() or None, ensembles=config.ensemble,
                                 n_boot=config.n_boot, seed=config.seed, plots=config.plots, likelihood=likelihood,
                                 html=config.html)
    except (MetricError, AgreementError) as e:
        raise ConfigError(str(e)) from None
    plots = sorted((out_dir / "plots").glob("*.png")) if config.plots else []
    files = {"index.html": out_dir / "index.html"} if config.html else {}
    if likelihood is not None:
        files["likelihood.csv"] = out_dir / "likelihood.csv"
    wrote = f"wrote {out_dir / 'metrics.json'}, {out_dir / 'report.md'}" + (
        f" and {out_dir / 'index.html'}" if config.html else "")
    return EvalResult(metrics, out_dir, out_dir / "report.md", out_dir / "metrics.json", plots, files,
                      "\n".join(filter(None, [_summary(metrics, list(scores) + list(config.ensemble)), wrote])))
