"""Inter-annotator agreement: Fleiss' kappa (Fleiss 1971) from per-sentence label counts (AlignBench D.3)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from halsift.corpus.errors import InputError
from halsift.corpus.percent import percent

COUNT_COLUMNS = ("n_correct", "n_incorrect", "n_unknown")


class AgreementError(InputError):
    """Counts that Fleiss' kappa cannot use; the message says which rows and why."""


def fleiss_kappa(counts: np.ndarray | Sequence[Sequence[int]]) -> dict[str, float]:
    """Fleiss' kappa from a subjects x categories matrix of rater counts.

    Rows may have different numbers of raters (the usual generalisation: P_i = sum n_ij(n_ij-1) / (n_i(n_i-1)),
    p_j = sum_i n_ij / sum_i n_i); rows with fewer than two raters carry no agreement information and are
    skipped. Returns ``kappa``, ``p_bar`` (observed agreement), ``p_e`` (chance agreement), ``n_subjects``,
    ``n_skipped``. Raises :class:`AgreementError` on negative counts or when no row has two raters.
    """
    c = np.asarray(counts, dtype=np.float64)
    if c.ndim != 2 or c.shape[1] < 2:
        raise AgreementError(f"fleiss_kappa: expected a subjects x categories matrix, got shape {c.shape}")
    if (c < 0).any() or not np.all(np.mod(c, 1) == 0):
        raise AgreementError("fleiss_kappa: counts must be non-negative integers")
    n_i = c.sum(axis=1)
    keep = n_i >= 2
    if not keep.any():
        raise AgreementError(f"fleiss_kappa: none of the {len(c)} subjects has two or more ratings")
    c, n_i = c[keep], n_i[keep]
    p_i = (c * (c - 1)).sum(axis=1) / (n_i * (n_i - 1))
    p_bar = float(p_i.mean())
    p_j = c.sum(axis=0) / n_i.sum()
    p_e = float((p_j ** 2).sum())
    kappa = (p_bar - p_e) / (1 - p_e) if p_e < 1 else float("nan")
    return {"kappa": float(kappa), "p_bar": p_bar, "p_e": p_e, "n_subjects": int(keep.sum()),
            "n_skipped": int((~keep).sum())}


def has_counts(df: pd.DataFrame) -> bool:
    """Whether a bench DataFrame carries annotator label counts (columns n_correct/n_incorrect/n_unknown)."""
    return all(col in df.columns for col in COUNT_COLUMNS) and df[list(COUNT_COLUMNS)].notna().any().any()


def bench_agreement(df: pd.DataFrame) -> dict[str, float]:
    """Fleiss' kappa over the bench rows (columns n_correct, n_incorrect, n_unknown), overall and per generator.

    Returns flat keys ``agreement/kappa``, ``agreement/p_bar`` (observed agreement, %, 0–100) and
    ``agreement/kappa/<generator>`` (kappa is a coefficient, -1..1, not a share). Rows without
    counts are skipped; a generator whose kappa is undefined (e.g. all one label) is left out.
    """
    missing = [col for col in COUNT_COLUMNS if col not in df.columns]
    if missing:
        raise AgreementError(f"agreement: bench rows lack the count field(s) {missing}")
    d = df.dropna(subset=list(COUNT_COLUMNS))
    overall = fleiss_kappa(d[list(COUNT_COLUMNS)].to_numpy())
    out = {"agreement/kappa": overall["kappa"], "agreement/p_bar": percent(overall["p_bar"])}
    if "generator" in d.columns:
        for gen, g in d.groupby("generator", sort=True):
            try:
                k = fleiss_kappa(g[list(COUNT_COLUMNS)].to_numpy())["kappa"]
            except AgreementError:
                continue
            if np.isfinite(k):
                out[f"agreement/kappa/{gen}"] = k
    return {k: v for k, v in out.items() if np.isfinite(v)}
