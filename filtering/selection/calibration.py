"""Calibration data for a guaranteed selection (:mod:`.guarantee`): labelled units scored by the corpus's detector.

``--calibration`` takes either

- a score folder of a bench (``halsift score --data bench.jsonl``): its parts hold the scores (key = the bench row's
  ``id``, sentence_index = its ``position``); the labels are joined from the bench file the folder's manifest names;
  or
- the labels file ``halsift annotate`` exports (a bench JSONL whose rows carry the corpus score, the detector and the
  stratum they were drawn from, in ``annotate``), or a score folder of it.

Units: sentences (``correct`` / ``incorrect``; ``unknown`` ones are left out and counted) or, for ``unit: caption``,
captions (hallucinated when any sentence is; a caption with an unknown sentence is left out), scored by ``agg``.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from halsift.corpus.bench import BenchFormatError, BenchRow, read_bench
from halsift.execution.run_folder import read_record
from halsift.corpus.sample import caption_label
from halsift.corpus.scores import ScoresFormatError, read_scores
from halsift.filtering.selection.guarantee import GuaranteeError, Strata
from halsift.filtering.selection.score_folder import SCORE_MANIFEST

ANNOTATE_KEY = "annotate"  # a labels row's extra field written by ``halsift annotate``


@dataclass
class Calibration:
    """Calibration units: scores (0-100), hallucinated flags, the stratified design where there is one."""

    scores: np.ndarray
    hallucinated: np.ndarray
    source: str
    strata: Strata | None = None
    info: dict = field(default_factory=dict)


def detector_of(score_dir: str | os.PathLike, chosen: str | None = None) -> dict:
    """The detector a score folder was made by: ``{"name", "spec"}`` from its manifest (``chosen``: the name
    selected with ``--detector`` in a folder of several)."""
    path = Path(score_dir)
    m = _manifest(path / SCORE_MANIFEST) if path.is_dir() else {}
    name = chosen or m.get("detector_name")
    if name is None:
        t = read_scores(path, ["detector"])
        names = sorted(set(t["detector"].to_pylist()))
        name = names[0] if len(names) == 1 else None
    spec = m.get("detector") if not chosen or chosen == m.get("detector_name") else None
    return {"name": name, "spec": spec}


def _manifest(path: Path) -> dict:
    return read_record(path, GuaranteeError, "calibration: ", "rescore the calibration set") or {}


def _same_detector(cal: dict, corpus: dict, where: str) -> None:
    if cal.get("spec") and corpus.get("spec"):
        same = cal["spec"] == corpus["spec"]
    else:
        same = cal.get("name") == corpus.get("name")
    if not same:
        raise GuaranteeError(f"calibration: {where} was scored by {cal.get('spec') or cal.get('name')!r}, the "
                             f"corpus by {corpus.get('spec') or corpus.get('name')!r}; score the calibration set "
                             "with the corpus's detector")


def load_calibration(path: str | os.PathLike, corpus_detector: dict, unit: str = "sentence", agg: str = "min",
                     captioners: list[str] | None = None, splits: list[str] | None = None) -> Calibration:
    """Read ``path`` (module docstring) into calibration units; raises :class:`GuaranteeError` (one line) on a set
    scored by another detector, one without labels, or one that is neither a score folder nor a labels file."""
    p = Path(path)
    if p.is_dir():
        m = _manifest(p / SCORE_MANIFEST)
        if m.get("role"):  # a pipeline's own stage (a cascade's): placeholders beside the judged units
            raise GuaranteeError(f"calibration: {p} is a {m['role']} folder, not a score folder of the calibration "
                                 f"set; give the folder that holds it ({p.parent.parent})")
        inputs = m.get("inputs") or {}
        if not inputs and m.get("members"):  # an ensemble's folder: its members' inputs
            inputs = _manifest(Path(m["members"][0]) / SCORE_MANIFEST).get("inputs") or {}
        if inputs.get("kind") != "bench":
            raise GuaranteeError(f"calibration: {p} holds no labels (its scores are of "
                                 f"{inputs.get('kind') or 'unknown'} data, not of a bench); score a labelled bench "
                                 "or `halsift annotate`'s labels with `halsift score --data FILE.jsonl`")
        _same_detector(detector_of(p), corpus_detector, str(p))
        try:
            t = read_scores(p, ["key", "sentence_index", "score"])
        except (ScoresFormatError, FileNotFoundError) as e:
            raise GuaranteeError(f"calibration: {e}") from None
        scored = dict(zip(t["key"].to_pylist(), t["score"].to_pylist()))
        bench = inputs["paths"][0]
        rows = _rows(bench)
        rows = [r for r in rows if r.id in scored]
        score_of = {r.id: float(scored[r.id]) for r in rows}
    elif p.is_file() and p.name.endswith(".jsonl"):
        rows = _rows(p)
        ann = [r.extra.get(ANNOTATE_KEY) for r in rows]
        if not rows or any(not isinstance(a, dict) or "score" not in a for a in ann):
            raise GuaranteeError(f"calibration: {p} is a bench without scores; score it with `halsift score --data "
                                 f"{p} --out DIR` by the corpus's detector and pass DIR")
        dets = {json.dumps(a.get("detector"), sort_keys=True) for a in ann}
        if len(dets) != 1:
            raise GuaranteeError(f"calibration: {p} mixes rows scored by several detectors")
        _same_detector(ann[0].get("detector") or {}, corpus_detector, str(p))
        score_of = {r.id: float(a["score"]) for r, a in zip(rows, ann)}
    elif not p.exists():
        raise GuaranteeError(f"calibration: {p} does not exist")
    else:
        raise GuaranteeError(f"calibration: {p}: expected a score folder of a labelled bench, or the labels .jsonl "
                             "that `halsift annotate` exports")
    return _units(rows, score_of, str(p), unit, agg, captioners, splits)


def _rows(path: str | os.PathLike) -> list[BenchRow]:
    """The calibration set's rows (read and checked once per file version and process, :func:`read_bench`: a report
    plans every filter's guarantee at every bound on the same set, 36 reads of it in the quickstart's report)."""
    try:
        return read_bench(path)
    except (BenchFormatError, FileNotFoundError) as e:
        raise GuaranteeError(f"calibration: {e}") from None


def _units(rows: list[BenchRow], score_of: dict[str, float], source: str, unit: str, agg: str,
           captioners: list[str] | None, splits: list[str] | None) -> Calibration:
    info = {"rows": len(rows)}
    if captioners is not None:
        rows = [r for r in rows if r.generator in set(captioners)]
        info["captioners"] = sorted(set(captioners))
    if splits is not None:
        rows = [r for r in rows if r.split in set(splits)]
        info["splits"] = sorted(set(splits))
    if not any(r.label in ("correct", "incorrect") for r in rows):
        raise GuaranteeError(f"calibration: {source} has no labelled (correct / incorrect) units"
                             + (f" of captioners {info.get('captioners')}" if captioners is not None else "")
                             + (f" in splits {info.get('splits')}" if splits is not None else ""))
    design = [r.extra.get(ANNOTATE_KEY) for r in rows]
    stratified = all(isinstance(a, dict) and "stratum" in a for a in design) and rows
    if unit == "caption" and agg != "prune":
        if stratified:
            raise GuaranteeError(f"calibration: {source} is a sample of sentences (halsift annotate); a caption "
                                 "guarantee needs captions labelled whole (e.g. a bench)")
        groups: dict[str, list[BenchRow]] = defaultdict(list)
        for r in rows:
            groups[r.caption_id].append(r)
        s, y, left_out = [], [], 0
        for rs in groups.values():
            lab = caption_label([r.label for r in rs])
            if lab not in ("correct", "incorrect"):
                left_out += 1
                continue
            s.append(_agg([score_of[r.id] for r in rs], agg))
            y.append(lab == "incorrect")
        info["unlabelled_left_out"] = left_out
        return Calibration(np.array(s, np.float64), np.array(y, bool), source, None, info)
    keep = [i for i, r in enumerate(rows) if r.label in ("correct", "incorrect")]
    info["unlabelled_left_out"] = len(rows) - len(keep)
    s = np.array([score_of[rows[i].id] for i in keep], np.float64)
    y = np.array([rows[i].label == "incorrect" for i in keep], bool)
    strata = None
    if stratified:
        a0 = design[0]
        strata = Strata(np.array([design[i]["stratum"] for i in keep], np.int64), list(a0["edges"]),
                        list(a0["population"]))
    return Calibration(s, y, source, strata, info)


def _agg(scores: list[float], agg: str) -> float:
    """A caption's score from its sentences' as select aggregates them (min / mean / prob)."""
    a = np.asarray(scores, np.float64)
    if agg == "mean":
        return float(a.mean())
    if agg == "prob":
        return float(100 * np.exp(np.log(np.maximum(a / 100, 1e-9)).sum()))
    return float(a.min())
