"""``select --max-hallucination A --confidence C --calibration CAL``: certify a threshold on the calibration units
(:mod:`.guarantee`, :mod:`.calibration`), select with it, and record the guarantee in the selection's manifest."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow.compute as pc

from halsift.corpus.percent import percent
from halsift.corpus.shards import write_json_atomic
from halsift.filtering.detectors.base import CAPTION_INDEX
from halsift.filtering.selection.calibration import Calibration, detector_of, load_calibration
from halsift.filtering.selection.guarantee import Guarantee, GuaranteeError, certify, check_levels, refusal

CORPUS_CAPTIONERS = "corpus"  # --calibration-captioners: the captioners the corpus's scores name


def _split_list(value: str | None) -> list[str] | None:
    return None if not value else [x.strip() for x in value.split(",") if x.strip()]


def corpus_captioners(scores_dir: str | os.PathLike) -> list[str]:
    """The captioners a corpus's score parts name (their ``captioner`` column)."""
    from halsift.corpus.scores import read_scores

    t = read_scores(scores_dir, ["captioner"])
    return sorted(str(c) for c in pc.unique(t["captioner"]).to_pylist() if c)


def plan_guarantee(scores_dir: str | os.PathLike, calibration: str | os.PathLike, max_hallucination: float,
                   confidence: float, unit: str = "sentence", agg: str = "min", detector: str | None = None,
                   captioners: str | list[str] | None = None, splits: str | list[str] | None = None
                   ) -> tuple[Guarantee, Calibration]:
    """The certified threshold for selecting from ``scores_dir``; raises :class:`GuaranteeError` with the one-line
    refusal (:func:`.guarantee.refusal`) when no threshold certifies ``max_hallucination``.
    ``captioners``: restrict a bench to these generators (``"corpus"``: the corpus's captioners); ``splits``: to
    these bench splits (comma-separated strings or lists)."""
    check_levels(max_hallucination, confidence)
    if agg == "repair":
        raise GuaranteeError("--max-hallucination: not with --agg repair (a repaired sentence's rate is not what "
                             "the calibration labels measure); use prune, min, mean or prob")
    caps = _split_list(captioners) if isinstance(captioners, str) or captioners is None else list(captioners)
    if caps == [CORPUS_CAPTIONERS]:
        caps = corpus_captioners(scores_dir)
    spl = _split_list(splits) if isinstance(splits, str) or splits is None else list(splits)
    cal = load_calibration(calibration, detector_of(scores_dir, detector), unit, agg, caps, spl)
    corpus = None
    if cal.strata is not None:
        from halsift.corpus.scores import read_scores

        t = read_scores(scores_dir, ["sentence_index", "score"])
        corpus = t.filter(pc.not_equal(t["sentence_index"], CAPTION_INDEX))["score"].to_numpy().astype(np.float64)
        if len(corpus) != sum(cal.strata.population):
            raise GuaranteeError(f"calibration: {calibration} was drawn from {sum(cal.strata.population)} units but "
                                 f"{scores_dir} holds {len(corpus)}: a sample of another corpus or score folder")
    g = certify(cal.scores, cal.hallucinated, max_hallucination, confidence, cal.strata, corpus)
    if g.threshold is None:
        err = GuaranteeError(refusal(g, str(calibration)))
        err.guarantee = g  # what was reachable: the report states it beside the refusal
        raise err
    return g, cal


def record_guarantee(out_dir: str | os.PathLike, manifest: dict, g: Guarantee, cal: Calibration) -> dict:
    """Add the ``guarantee`` block (A, C, calibration size, threshold, bound, kept share; percentages) to a
    complete selection's manifest and write it again; returns the manifest."""
    kept = manifest.get("selected", manifest.get("kept_units")) or 0
    cand = manifest.get("candidates") or 0
    manifest["guarantee"] = {**g.manifest(), "calibration": str(cal.source), "calibration_info": cal.info,
                             "kept": percent(kept / cand, 4) if cand else None}
    write_json_atomic(Path(out_dir) / "manifest.json", manifest)
    return manifest


def guarantee_line(m: dict) -> str:
    """One line for the user: what the selection guarantees."""
    g = m["guarantee"]
    return (f"guarantee: kept units hallucinated <= {g['max_hallucination']:g}% with {g['confidence']:g}% confidence "
            f"(bound {g['bound']:.2f}%, {g['calibration_units']} calibration units, threshold {g['threshold']:g}, "
            f"kept {g['kept']:.2f}%)")




REPORT_LEVELS = (0.05, 0.1, 0.2)  # the compare report's guaranteed-selection row: kept share at these A


def guaranteed_kept(scores_dir: str | os.PathLike, calibration: str | os.PathLike, confidence: float = 0.9,
                    levels: tuple[float, ...] = REPORT_LEVELS, unit: str = "sentence", agg: str = "min",
                    captioners: str | list[str] | None = None, splits: str | list[str] | None = None
                    ) -> dict[str, float | None]:
    """Per level A (keyed by its percentage, e.g. ``"5"``): the share (0-100) of the corpus's units a guaranteed
    selection keeps, None where no threshold certifies A (the compare report's third way to compare filters); and
    ``units`` (calibration units) and ``best_bound`` (the lowest upper bound any threshold reaches, %)."""
    from halsift.corpus.scores import read_scores
    from halsift.filtering.selection.select import select_keys

    t = read_scores(scores_dir, ["key", "sentence_index", "score"])
    out: dict[str, float | None] = {}
    for a in levels:
        try:
            g, _ = plan_guarantee(scores_dir, calibration, a, confidence, unit, agg, None, captioners, splits)
        except GuaranteeError as e:
            out[f"{100 * a:g}"] = None
            g = getattr(e, "guarantee", None)
            if g is not None:  # the best bound any threshold reached, and on how many labelled units
                out["units"], out["best_bound"] = g.calibration_units, percent(g.best_bound, 2)
            continue
        out["units"], out["best_bound"] = g.calibration_units, percent(g.best_bound, 2)
        _, info = select_keys(t, threshold=g.threshold, unit=unit, agg=agg)
        out[f"{100 * a:g}"] = percent(info["selected"] / info["candidates"], 4) if info["candidates"] else None
    return out
