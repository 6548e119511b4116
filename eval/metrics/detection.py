"""Sentence-level detection metrics of AlignBench / HalDec-Bench (pure functions on arrays and DataFrames).

Conventions (the papers' Table 3 / Table 2): scores are 0–100, higher = more likely correct; AUROC is reported on
a 0–100 scale with the positive class = ``correct``, and so are precision, base rate and the failure and incorrect
rates (percentages); rows labelled ``unknown`` are excluded. A *scored bench*
DataFrame has at least the columns ``generator``, ``generator_type`` (i2t|t2i), ``label`` and ``score``; some
metrics also use ``position``, ``types``, ``image_id`` and ``parsed``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import pandas as pd
from sklearn.metrics import roc_auc_score

from halsift.corpus.errors import InputError
from halsift.corpus.percent import percent

PARSE_FAILURE_LIMIT = 5.0  # % : the papers list only detectors whose parse-failure rate is below 5%


class MetricError(InputError):
    """A metric cannot be computed from the given data (e.g. a single class); the message says why."""


def binary_labels(labels: Sequence | np.ndarray | pd.Series) -> np.ndarray:
    """``correct`` -> 1, ``incorrect`` -> 0; bools and 0/1 integers pass through. Anything else is an error."""
    arr = np.asarray(labels)
    if arr.dtype.kind in "biu":
        bad = arr[(arr != 0) & (arr != 1)] if arr.dtype.kind != "b" else arr[:0]
        if bad.size:
            raise MetricError(f"labels: expected 0/1 or 'correct'/'incorrect', got {bad[0]!r}")
        return arr.astype(np.int8)
    out = np.full(arr.shape, -1, np.int8)
    out[arr == "correct"] = 1
    out[arr == "incorrect"] = 0
    if (out < 0).any():
        raise MetricError(f"labels: expected 'correct' or 'incorrect' (exclude 'unknown' first), got "
                          f"{arr[out < 0][0]!r}")
    return out


def auroc(labels: Sequence | np.ndarray, scores: Sequence[float] | np.ndarray) -> float:
    """AUROC on the 0–100 scale, positive class = correct (``sklearn.metrics.roc_auc_score`` × 100).

    Raises :class:`MetricError` when only one class is present or a score is missing (NaN).
    """
    y = binary_labels(labels)
    s = np.asarray(scores, dtype=np.float64)
    if y.shape != s.shape:
        raise MetricError(f"auroc: {y.shape[0]} labels but {s.shape[0]} scores")
    if np.isnan(s).any():
        raise MetricError(f"auroc: {int(np.isnan(s).sum())} score(s) are missing (NaN); drop or fill them first")
    n_pos = int(y.sum())
    if n_pos == 0 or n_pos == len(y):
        only = "correct" if n_pos else "incorrect"
        raise MetricError(f"auroc: only one class present ({len(y)} sentence(s), all {only}); "
                          "AUROC needs both correct and incorrect sentences")
    return float(100.0 * roc_auc_score(y, s))


def labelled(df: pd.DataFrame) -> pd.DataFrame:
    """The rows that count for metrics: label ``correct`` or ``incorrect`` (``unknown`` dropped)."""
    missing = [c for c in ("label",) if c not in df.columns]
    if missing:
        raise MetricError(f"scored bench lacks column(s) {missing}")
    return df[df["label"].isin(("correct", "incorrect"))]


def generator_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per generator: ``generator_type``, ``n``, ``n_correct``, ``n_incorrect``, ``auroc`` (NaN when n/a)
    and ``note`` (the reason it is n/a, else empty). Sorted i2t first, then by generator name."""
    need = ["generator", "generator_type", "label", "score"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise MetricError(f"scored bench lacks column(s) {missing}; expected {need}")
    d = labelled(df)
    rows = []
    for (gtype, gen), g in d.groupby(["generator_type", "generator"], sort=True):
        n_c = int((g["label"] == "correct").sum())
        n_i = len(g) - n_c
        try:
            value, note = auroc(g["label"].to_numpy(), g["score"].to_numpy()), ""
        except MetricError as e:
            value = float("nan")
            note = ("only one class (%d correct, %d incorrect)" % (n_c, n_i)) if "one class" in str(e) else str(e)
        rows.append({"generator": gen, "generator_type": gtype, "n": len(g), "n_correct": n_c,
                     "n_incorrect": n_i, "auroc": value, "note": note})
    return pd.DataFrame(rows, columns=["generator", "generator_type", "n", "n_correct", "n_incorrect", "auroc",
                                       "note"])


def auroc_by_generator(df: pd.DataFrame) -> dict[str, float]:
    """AUROC (0–100) per generator plus summaries, as flat metric keys.

    Input: a DataFrame with columns ``generator``, ``generator_type`` (i2t|t2i), ``label``
    (correct|incorrect|unknown) and ``score`` (0–100, higher = more likely correct); ``unknown`` rows are excluded.
    Returns ``{"auroc/<generator>": v, ..., "auroc/mean": mean over generators, "auroc/i2t": mean over i2t
    generators, "auroc/t2i": mean over t2i generators}`` (Table 3's "Avg." is the mean over generators).
    Generators with a single class are left out (see :func:`generator_table` for the reason); a summary over no
    valid generator is left out too. Raises :class:`MetricError` if no generator has both classes.
    """
    table = generator_table(df)
    ok = table[table["auroc"].notna()]
    if ok.empty:
        reasons = "; ".join(f"{r.generator}: {r.note}" for r in table.itertuples()) or "no labelled rows"
        raise MetricError(f"auroc: no generator has both correct and incorrect sentences ({reasons})")
    out = {f"auroc/{r.generator}": float(r.auroc) for r in ok.itertuples()}
    out["auroc/mean"] = float(ok["auroc"].mean())
    for gtype in ("i2t", "t2i"):
        sub = ok[ok["generator_type"] == gtype]
        if len(sub):
            out[f"auroc/{gtype}"] = float(sub["auroc"].mean())
    return out


def failure_rate(parsed: Sequence[bool] | np.ndarray) -> float:
    """Percentage (0–100) of sentences whose judge output could not be parsed (score fell back to 50)."""
    p = np.asarray(parsed, dtype=bool)
    if p.size == 0:
        raise MetricError("failure_rate: no scores")
    return percent(1.0 - p.mean())


def _types_column(df: pd.DataFrame) -> pd.Series:
    return df["types"].map(lambda t: list(t) if t is not None and not isinstance(t, str) else ([t] if t else []))


def mean_score_by_type(df: pd.DataFrame, types: Iterable[str] | None = None) -> pd.DataFrame:
    """Mean score per hallucination type over *incorrect* sentences (lower is better; Fig. 9).

    A sentence with several types counts once for each. Columns: ``type``, ``n``, ``mean_score``; types that
    never occur are listed with n = 0 and mean NaN only if named in ``types``.
    """
    inc = df[df["label"] == "incorrect"]
    exploded = pd.DataFrame({"type": _types_column(inc), "score": inc["score"].to_numpy()}).explode("type")
    exploded = exploded.dropna(subset=["type"])
    g = exploded.groupby("type")["score"].agg(["count", "mean"]).rename(columns={"count": "n", "mean": "mean_score"})
    if types is not None:
        g = g.reindex(list(types))
        g["n"] = g["n"].fillna(0).astype(int)
    return g.reset_index().rename(columns={"index": "type"})


def score_by_position(df: pd.DataFrame) -> pd.DataFrame:
    """Per sentence position (0-based): mean score of correct and of incorrect sentences (Fig. 7) and the
    incorrect rate (Fig. E; % of the labelled sentences, 0–100). Columns: ``position``, ``n_correct``,
    ``n_incorrect``, ``mean_correct``, ``mean_incorrect``, ``incorrect_rate``. A mean over no sentence is NaN (shown as n/a in reports)."""
    d = labelled(df)
    rows = []
    for pos, g in d.groupby("position", sort=True):
        c = g.loc[g["label"] == "correct", "score"]
        i = g.loc[g["label"] == "incorrect", "score"]
        rows.append({"position": int(pos), "n_correct": len(c), "n_incorrect": len(i),
                     "mean_correct": float(c.mean()) if len(c) else float("nan"),
                     "mean_incorrect": float(i.mean()) if len(i) else float("nan"),
                     "incorrect_rate": percent(len(i) / len(g))})
    return pd.DataFrame(rows, columns=["position", "n_correct", "n_incorrect", "mean_correct", "mean_incorrect",
                                       "incorrect_rate"])


def precision_at_keep(df: pd.DataFrame, keep: float = 0.2) -> pd.DataFrame:
    """Per generator: precision (% correct = 100 − noise rate) of the top ``keep`` share of sentences by score,
    vs the base rate of correct sentences (HalDec Fig. 8). ``ceil(keep * n)`` sentences are kept; sentences tied
    at the cut are taken in expectation over a random tie-break (so a judge's fallback score 50 favours no row).
    Columns: ``generator``, ``n``, ``n_kept``, ``precision``, ``base_rate`` (both percentages, 0–100)."""
    if not 0 < keep <= 1:
        raise MetricError(f"keep: expected a share in (0, 1], got {keep}")
    d = labelled(df)
    rows = []
    for gen, g in d.groupby("generator", sort=True):
        y = (g["label"] == "correct").to_numpy()
        s = g["score"].to_numpy(dtype=np.float64)
        k = int(np.ceil(keep * len(g)))
        cut = np.sort(s)[::-1][k - 1]
        above, tied = s > cut, s == cut
        hits = y[above].sum() + (k - above.sum()) * y[tied].mean()
        rows.append({"generator": gen, "n": len(g), "n_kept": k, "precision": percent(hits / k),
                     "base_rate": percent(y.mean())})
    return pd.DataFrame(rows, columns=["generator", "n", "n_kept", "precision", "base_rate"])


def self_preference(aurocs: Mapping[str, Mapping[str, float]], mapping: Mapping[str, str]) -> pd.DataFrame:
    """Self-preference matrix (Fig. 8 / Fig. 10): AUROC of detector (row) on generator (column), divided by the
    detector's mean AUROC over the generators shown. ``aurocs[detector][generator]`` (NaN/missing = n/a);
    ``mapping[detector] = generator`` names each detector's own captioner (the diagonal). Columns are the
    mapped generators in mapping order; rows the detectors. Values near/below 1 on the diagonal = self-preference.
    """
    dets = list(mapping)
    gens = list(dict.fromkeys(mapping.values()))
    unknown = [d for d in dets if d not in aurocs]
    if unknown:
        raise MetricError(f"self-preference: detector(s) {unknown} have no scores; known: {sorted(aurocs)}")
    m = pd.DataFrame([[aurocs[d].get(g, np.nan) for g in gens] for d in dets], index=dets, columns=gens,
                     dtype=float)
    missing = [g for g in gens if m[g].isna().all()]
    if missing:
        raise MetricError(f"self-preference: generator(s) {missing} have no valid AUROC (not in the bench, or only "
                          "one class)")
    return m.div(m.mean(axis=1, skipna=True), axis=0)


def ensemble_scores(member_scores: Sequence[np.ndarray | pd.Series]) -> np.ndarray:
    """Ensemble score = mean of the members' scores per sentence (Table 6): the ``ensemble`` detector's
    :func:`halsift.filtering.detectors.ensemble.combine` with equal weights and no normalisation."""
    from halsift.filtering.detectors.ensemble import combine

    if len(member_scores) < 2:
        raise MetricError("ensemble: needs at least two members")
    arr = np.vstack([np.asarray(s, dtype=np.float64) for s in member_scores])
    return combine(arr, [1.0] * len(arr), "none")


def ensemble_gain(ensemble: Mapping[str, float], members: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Gain of an ensemble over its *better* member, per metric key present in all (Table 6's (+x.x))."""
    out = {}
    for k, v in ensemble.items():
        vals = [m[k] for m in members if k in m]
        if len(vals) == len(members):
            out[k] = float(v - max(vals))
    return out
