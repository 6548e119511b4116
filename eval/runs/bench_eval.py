"""The detection benchmark evaluation (AlignBench / HalDec-Bench): join score tables to the bench, compute every
metric for every detector (and ensembles), write ``metrics.json``, ``report.md`` and plots.

Metric keys (DESIGN.md "Metrics"); ``P`` is empty with one detector and ``<detector>/`` with several:
``P auroc/<generator>|mean|i2t|t2i``, ``P auroc_lo/...`` and ``P auroc_hi/...`` (bootstrap 95% CI),
``failure_rate/<detector>`` (and plain ``failure_rate`` with one detector), ``P n_scored``, ``P n_missing``,
``P precision@<keep>/<generator>``, ``P base_rate/<generator>``, ``P type_score/<Type>``,
``P position/<i>/correct|incorrect``, ``P localization/ap|miou`` (mean over generators) and
``P localization/ap|miou/<generator>``, ``<ensemble>/auroc_gain/<generator>|mean``,
``self_preference/<detector>/<generator>``, ``bench/...`` (sizes, incorrect rate by position),
and percentages (precision, base rate, failure and incorrect rates, ``agreement/p_bar``) on the 0–100 scale of
AUROC, marked ``"scale": 100`` (an unmarked metrics.json of an earlier halsift is read by :func:`read_bench_metrics`),
``agreement/kappa`` when the bench carries annotator counts, ``likelihood/...`` with a likelihood table
(:mod:`halsift.eval.metrics.likelihood`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from halsift.corpus.bench import TYPES, read_bench
from halsift.corpus.percent import mark_percent, read_on_percent_scale
from halsift.eval.metrics import detection as det
from halsift.eval.metrics.agreement import AgreementError, bench_agreement, has_counts
from halsift.eval.metrics.bootstrap import bootstrap_auroc
from halsift.eval.metrics.localization import localization_metrics, parse_marked


# metrics.json keys that held shares (0–1) before halsift marked its percentages with "scale": 100
SHARES_BEFORE_SCALE = ("*precision@*", "*base_rate/*", "failure_rate", "failure_rate/*", "bench/incorrect_rate/*",
                       "agreement/p_bar")


def read_bench_metrics(path: str | os.PathLike) -> dict:
    """An ``eval bench`` metrics.json with its percentages on 0–100, whatever halsift wrote it."""
    import json

    return read_on_percent_scale(json.loads(Path(path).read_text()), SHARES_BEFORE_SCALE, f"{path}")


@dataclass
class DetectorResult:
    """Everything computed for one detector (or ensemble) on the bench."""

    name: str
    scored: pd.DataFrame  # bench rows that have a score (columns of the bench + score, parsed)
    n_missing: int  # bench rows without a score
    n_unmatched: int  # score rows whose (key, sentence_index) is not in the bench
    generators: pd.DataFrame  # detection.generator_table (with n/a notes)
    aurocs: dict[str, float]  # detection.auroc_by_generator keys
    cis: dict[str, tuple[float, float]]
    failure_rate: float
    types: pd.DataFrame
    positions: pd.DataFrame
    precision: pd.DataFrame
    localization: pd.DataFrame | None = None  # per generator: ap, miou, n_sentences, n_pred
    members: list[str] = field(default_factory=list)  # ensemble members
    notes: list[str] = field(default_factory=list)


def bench_frame(bench_path: str | os.PathLike) -> pd.DataFrame:
    """The bench as a DataFrame (one row per sentence; extra fields become columns). Empty bench -> error."""
    rows = read_bench(bench_path)
    if not rows:
        raise det.MetricError(f"bench: {bench_path} has no rows; nothing to evaluate")
    return pd.DataFrame([r.to_json() for r in rows])


def join_scores(bench: pd.DataFrame, scores: pd.DataFrame, name: str) -> tuple[pd.DataFrame, int, int]:
    """Attach a detector's scores to the bench rows (``key`` = row ``id``, ``sentence_index`` = ``position``).

    Returns (scored rows, number of bench rows without a score, number of score rows not in the bench).
    Raises :class:`MetricError` for missing columns, duplicated keys, or when no bench row has a score.
    """
    need = ["key", "sentence_index", "score"]
    missing = [c for c in need if c not in scores.columns]
    if missing:
        raise det.MetricError(f"detector {name}: scores lack column(s) {missing}; expected {need}")
    s = scores.copy()
    s["key"] = s["key"].astype(str)
    s["sentence_index"] = s["sentence_index"].astype(int)
    if "parsed" not in s.columns:
        s["parsed"] = True
    dup = s.duplicated(["key", "sentence_index"])
    if dup.any():
        k = s.loc[dup].iloc[0]
        raise det.MetricError(f"detector {name}: {int(dup.sum())} duplicated score rows, e.g. key={k['key']!r} "
                              f"sentence_index={k['sentence_index']}")
    s = s.rename(columns={"spans": "pred_spans"})  # the bench's own ``spans`` are the ground truth
    keep = ["key", "sentence_index", "score", "parsed"] + [c for c in ("pred_spans", "output") if c in s.columns]
    merged = bench.merge(s[keep], how="left", left_on=["id", "position"], right_on=["key", "sentence_index"],
                         indicator=True)
    hit = (merged["_merge"] == "both") & merged["score"].notna()
    n_matched = int((merged["_merge"] == "both").sum())
    if not hit.any():
        raise det.MetricError(
            f"detector {name}: none of the {len(bench)} bench rows has a score (score keys look like "
            f"{s['key'].head(3).tolist()}, bench ids like {bench['id'].head(3).tolist()}; key must be the row id "
            "and sentence_index its position)")
    scored = merged[hit].drop(columns=["_merge", "key", "sentence_index"]).reset_index(drop=True)
    scored["parsed"] = scored["parsed"].fillna(True).astype(bool)
    return scored, int(len(bench) - hit.sum()), int(len(s) - n_matched)


def _as_spans(value) -> list[tuple[int, int]]:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return []
    return [(int(a), int(b)) for a, b in value]


def localization_table(scored: pd.DataFrame) -> pd.DataFrame | None:
    """Per-generator AP / mIoU over incorrect sentences with ground-truth spans; None without predictions.

    Predictions come from a ``pred_spans`` column (the score table's ``spans``: word ranges) or an ``output``
    column (judge replies in the ``**[...]**`` format, parsed here).
    """
    if "pred_spans" in scored.columns:
        pred = scored["pred_spans"].map(_as_spans)
    elif "output" in scored.columns:
        pred = pd.Series([parse_marked(o, s) if isinstance(o, str) else [] for o, s in
                          zip(scored["output"], scored["sentence"])], index=scored.index)
    else:
        return None
    gt = scored["spans"].map(_as_spans)
    mask = (scored["label"] == "incorrect") & (gt.map(len) > 0)
    if not mask.any():
        return None
    rows = []
    for gen, idx in scored[mask].groupby("generator", sort=True).groups.items():
        m = localization_metrics(list(pred[idx]), list(gt[idx]))
        rows.append({"generator": gen, **m})
    return pd.DataFrame(rows)


def evaluate_detector(bench: pd.DataFrame, scores: pd.DataFrame, name: str, keep: float = 0.2,
                      n_boot: int = 1000, seed: int = 0, scored: pd.DataFrame | None = None,
                      n_missing: int = 0, n_unmatched: int = 0) -> DetectorResult:
    """All per-detector metrics (pass ``scored`` to skip the join, as ensembles do)."""
    if scored is None:
        scored, n_missing, n_unmatched = join_scores(bench, scores, name)
    gens = det.generator_table(scored)
    notes = [f"{r.generator}: AUROC n/a, {r.note}" for r in gens.itertuples() if r.note]
    try:
        aurocs = det.auroc_by_generator(scored)
        cis = bootstrap_auroc(scored, n_boot=n_boot, seed=seed)
    except det.MetricError as e:
        aurocs, cis = {}, {}
        notes.append(str(e))
    if n_missing:
        notes.append(f"{n_missing} of {len(bench)} bench rows have no score and are left out")
    if n_unmatched:
        notes.append(f"{n_unmatched} score rows match no bench row (key, sentence_index) and are ignored")
    fr = det.failure_rate(scored["parsed"].to_numpy())
    if fr > det.PARSE_FAILURE_LIMIT:
        notes.append(f"parse-failure rate {fr:.1f}% exceeds {det.PARSE_FAILURE_LIMIT:.0f}% "
                     "(the papers leave such detectors out of Table 3)")
    return DetectorResult(
        name=name, scored=scored, n_missing=n_missing, n_unmatched=n_unmatched, generators=gens, aurocs=aurocs,
        cis=cis, failure_rate=fr, types=det.mean_score_by_type(scored, TYPES),
        positions=det.score_by_position(scored), precision=det.precision_at_keep(scored, keep),
        localization=localization_table(scored), notes=notes)


def ensemble_result(bench: pd.DataFrame, results: Mapping[str, DetectorResult], spec: str, keep: float,
                    n_boot: int, seed: int) -> DetectorResult:
    """Ensemble ``A+B[+C...]``: mean of the members' scores on the rows all members scored (Table 6)."""
    members = [m.strip() for m in spec.split("+")]
    unknown = [m for m in members if m not in results]
    if len(members) < 2 or unknown or len(set(members)) != len(members):
        raise det.MetricError(f"ensemble {spec!r}: expected two or more distinct detectors joined by '+' among "
                              f"{sorted(results)}" + (f"; unknown {unknown}" if unknown else ""))
    frames = [results[m].scored.set_index("id") for m in members]
    common = frames[0].index
    for f in frames[1:]:
        common = common.intersection(f.index)
    if common.empty:
        raise det.MetricError(f"ensemble {spec!r}: the members share no scored bench row")
    base = frames[0].loc[common].drop(columns=[c for c in ("pred_spans", "output") if c in frames[0].columns])
    base["score"] = det.ensemble_scores([f.loc[common, "score"].to_numpy() for f in frames])
    base["parsed"] = np.logical_and.reduce([f.loc[common, "parsed"].to_numpy(dtype=bool) for f in frames])
    scored = base.reset_index()
    res = evaluate_detector(bench, scored, spec, keep, n_boot, seed, scored=scored,
                            n_missing=len(bench) - len(scored))
    res.members = members
    return res


def collect_metrics(bench: pd.DataFrame, results: Sequence[DetectorResult], keep: float,
                    self_pref: pd.DataFrame | None) -> dict[str, float]:
    """Flat metrics.json content (finite numbers only: n/a values are explained in report.md instead)."""
    out: dict[str, float] = {}
    lab = det.labelled(bench)
    out["bench/n_rows"] = len(bench)
    out["bench/n_labelled"] = len(lab)
    out["bench/n_unknown"] = len(bench) - len(lab)
    out["bench/n_generators"] = int(bench["generator"].nunique())
    for r in det.score_by_position(bench.assign(score=0.0)).itertuples():
        out[f"bench/incorrect_rate/{r.position}"] = r.incorrect_rate
    if has_counts(bench):
        try:
            out.update(bench_agreement(bench))
        except AgreementError:
            pass
    several = len(results) > 1
    for res in results:
        p = f"{res.name}/" if several else ""
        out.update({p + k: v for k, v in res.aurocs.items()})
        for k, (lo, hi) in res.cis.items():
            out[p + k.replace("auroc/", "auroc_lo/", 1)] = lo
            out[p + k.replace("auroc/", "auroc_hi/", 1)] = hi
        out[f"failure_rate/{res.name}"] = res.failure_rate
        if not several:
            out["failure_rate"] = res.failure_rate
        out[p + "n_scored"] = len(res.scored)
        out[p + "n_missing"] = res.n_missing
        for r in res.precision.itertuples():
            out[f"{p}precision@{keep:g}/{r.generator}"] = r.precision
            out[f"{p}base_rate/{r.generator}"] = r.base_rate
        for r in res.types.itertuples():
            out[f"{p}type_score/{r.type}"] = r.mean_score
        for r in res.positions.itertuples():
            out[f"{p}position/{r.position}/correct"] = r.mean_correct
            out[f"{p}position/{r.position}/incorrect"] = r.mean_incorrect
        if res.localization is not None:
            for metric in ("ap", "miou"):
                vals = res.localization.set_index("generator")[metric]
                out[f"{p}localization/{metric}"] = float(vals.mean())
                out.update({f"{p}localization/{metric}/{g}": float(v) for g, v in vals.items()})
        if res.members:
            gains = det.ensemble_gain(res.aurocs, [r2.aurocs for r2 in results if r2.name in res.members])
            out.update({f"{res.name}/auroc_gain/{k.split('/', 1)[1]}": v for k, v in gains.items()})
    if self_pref is not None:
        for d_name, row in self_pref.iterrows():
            out.update({f"self_preference/{d_name}/{g}": float(v) for g, v in row.items()})
    return {k: (int(v) if isinstance(v, (int, np.integer)) else float(v)) for k, v in out.items()
            if v is not None and np.isfinite(v)}


def evaluate_bench(bench_path: str | os.PathLike, scores: Mapping[str, pd.DataFrame], out_dir: str | os.PathLike,
                   keep: float = 0.2, self_pref_map: Mapping[str, str] | None = None,
                   ensembles: Sequence[str] = (), n_boot: int = 1000, seed: int = 0,
                   plots: bool = True, likelihood: pd.DataFrame | None = None, html: bool = False) -> dict[str, float]:
    """Evaluate detectors on a bench and write ``metrics.json``, ``report.md`` and ``plots/*.png`` to ``out_dir``.

    ``scores`` maps a detector name to its score table (columns ``key``, ``sentence_index``, ``score``, optional
    ``parsed``, ``spans`` or ``output``). ``self_pref_map`` maps detector -> the generator that is the same model
    (the self-preference diagonal). ``ensembles`` are ``"A+B"`` specs over the detector names. ``likelihood`` (a
    :func:`halsift.eval.metrics.likelihood.likelihood_table`) adds the ``likelihood/...`` metrics and the Fig. 7 section.
    ``html`` also writes ``index.html`` with a browser of the bench's captions (:mod:`halsift.eval.report.html`).
    Returns the flat metrics (with ``"scale": 100``, as written).
    """
    from halsift.corpus.shards import write_json_atomic
    from halsift.eval.report.bench import write_report

    if not scores:
        raise det.MetricError("evaluate_bench: no detector scores given")
    bench = bench_frame(bench_path)
    if det.labelled(bench).empty:
        raise det.MetricError(f"bench: {bench_path} has {len(bench)} rows but all are labelled 'unknown'")
    results: dict[str, DetectorResult] = {}
    for name, table in scores.items():
        results[name] = evaluate_detector(bench, table, name, keep, n_boot, seed)
    for spec in ensembles:
        results[spec] = ensemble_result(bench, results, spec, keep, n_boot, seed)
    self_pref = None
    if self_pref_map:
        by_det = {n: dict(zip(r.generators["generator"], r.generators["auroc"])) for n, r in results.items()}
        unknown_gen = sorted(set(self_pref_map.values()) - set(bench["generator"]))
        if unknown_gen:
            raise det.MetricError(f"self-preference: generator(s) {unknown_gen} are not in the bench; known: "
                                  f"{sorted(bench['generator'].unique())}")
        self_pref = det.self_preference(by_det, self_pref_map)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics = collect_metrics(bench, list(results.values()), keep, self_pref)
    if likelihood is not None:
        from halsift.eval.metrics.likelihood import likelihood_metrics

        metrics.update(likelihood_metrics(likelihood))
    metrics = mark_percent(metrics)
    write_json_atomic(out_dir / "metrics.json", metrics)
    write_report(out_dir, bench, list(results.values()), metrics, keep=keep, self_pref=self_pref,
                 self_pref_map=self_pref_map, plots=plots, likelihood=likelihood)
    if html:
        from halsift.eval.report.html import write_bench_html

        write_bench_html(out_dir, bench_path, list(results.values()), metrics, keep)
    return metrics
