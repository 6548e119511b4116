"""Selection: keep the best-scored image–sentence pairs (or captions) and write them as new shards.

Two steps, so that neither holds the corpus in memory (DataComp's apply_filter -> resharder split):

1. :func:`select_keys` reads only the score columns (pyarrow) and picks the kept units: a fraction
   (``keep``, rounded half up), a count (``top_k``) or a ``threshold``; per captioner if asked. Ties at the cut-off are
   broken by (key, sentence_index) ascending, so the same scores always give the same selection.
   ``random_baseline`` keeps the same number of units chosen uniformly at random (seeded).
2. :func:`select` streams the input shards once and writes the kept units as new shards (``sizes.json``),
   ``kept.parquet`` (the subset, usable without resharding) and ``manifest.json`` (``status: running`` from the
   start, ``complete`` at the end; ``train clip`` refuses a folder whose selection did not complete).

Inputs and the output folder are checked before anything is written, by the checks ``select --resumable`` runs
too (:func:`halsift.filtering.selection.guard.prepare`: the score folder and each part's recorded content, the input
shards against the fingerprints their parts record, the output folder apart from both, and its state: a killed
select reruns to the same bytes, a complete one is returned as it is); then here no (key, sentence_index) row may
repeat; a kept sentence index beyond its caption's sentences is an error naming the part. A key repeated within an
input shard is skipped and counted (``duplicate``; the first occurrence is selected). A sample the shard writer
rejects (e.g. a key with characters outside ``[A-Za-z0-9_-]``) is skipped and counted on its own (``skipped`` in
the manifest); an unreadable shard is counted with the number of samples lost.

Units: ``sentence`` (one output sample per kept image–sentence pair, key ``<key>_s<idx>``) or ``caption``
with ``agg``: ``min`` / ``mean`` of the sentence scores, ``prob`` (100 x product of score/100, i.e. the
probability that every sentence is correct), or ``prune`` (select sentences, then write each caption with
only its kept sentences), or ``repair`` (as prune, and a flagged sentence a detector localized is kept without its
flagged words: :mod:`halsift.filtering.selection.repair`).
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from halsift.corpus.progress import progress
from halsift.corpus.images import SkipCounter
from halsift.corpus.percent import SCALE, percent
from halsift.corpus.scores import read_part, read_scores, write_part_atomic
from halsift.corpus.sample import caption_label as _caption_label, sentences_of as _labels  # one rule (corpus)
from halsift.corpus.units import AGGS, UNITS
from halsift.corpus.shards import META_DEFAULTS, Sample, ShardFormatError, ShardWriter, iter_shard, write_json_atomic
from halsift.filtering.detectors.base import CAPTION_INDEX
from halsift.filtering.detectors.baselines import hash_uniform
from halsift.filtering.selection.score_folder import ScoreFolder, SelectError, check_score_folder, repeated_rows_error
from halsift.filtering.selection.guard import (clear_outputs, prepare, remove_selection,
                                            write_outputs)

SENTENCE_AGGS = ("prune", "repair")  # caption aggs that select sentences (then write captions of the kept ones)



def load_scores(scores: str | os.PathLike, detector: str | None = None, allow_partial: bool = False,
                captioner: bool = True, folder: ScoreFolder | None = None) -> tuple[pa.Table, dict]:
    """Check a score folder (or one parquet file) with :func:`check_score_folder` (unless given the checked
    ``folder``) and read it for selection; returns ``(table, info)``.

    ``table`` has key, sentence_index (int32), score and (with ``captioner``, when the parts have it) captioner.
    Besides the folder checks, raises :class:`SelectError` when a (key, sentence_index) row repeats. Memory: the
    detector column is read (dictionary-encoded) only when rows of another detector must be dropped.
    """
    folder = folder or check_score_folder(scores, detector, allow_partial)
    tables, dropped = [], 0
    for p in folder.parts:
        cols = ["key", "sentence_index", "score"]
        cols += ["captioner"] if captioner and "captioner" in pq.read_schema(p).names else []
        if folder.other_detectors:
            t = read_part(p, cols + ["detector"], read_dictionary=["detector"])
            keep = pc.equal(t["detector"].cast(pa.string()), detector)
            dropped += len(t) - (pc.sum(keep).as_py() or 0)
            t = t.filter(keep).drop_columns(["detector"])
        else:
            t = read_part(p, cols)
        tables.append(t)
    table = pa.concat_tables(tables, promote_options="default")
    counts = table.group_by(["key", "sentence_index"], use_threads=False).aggregate([("score", "count")])
    dup = counts.filter(pc.greater(counts["score_count"], 1))
    if len(dup):
        k, idx = dup["key"][0].as_py(), dup["sentence_index"][0].as_py()
        raise repeated_rows_error(k, idx, parts_holding(folder.parts, k, idx), len(dup))
    return table, {**folder.info(allow_partial), "rows_of_other_detectors_dropped": dropped}


def parts_holding(parts: list[Path], key: str, sentence_index: int | None = None) -> list[Path]:
    """The parts that hold ``key`` (at ``sentence_index``): only read to name them in an error."""
    found = []
    for p in parts:
        t = read_part(p, ["key", "sentence_index"])
        hit = pc.equal(t["key"], key)
        if sentence_index is not None:
            hit = pc.and_(hit, pc.equal(t["sentence_index"], sentence_index))
        if pc.any(hit).as_py():
            found.append(p)
    return found


def _top_n(score: np.ndarray, n: int, table: pa.Table, rows: np.ndarray,
           seed: int = 0) -> tuple[np.ndarray, float | None]:
    """Positions (into ``score``) of the ``n`` highest scores. ``rows`` maps positions to rows of ``table``.

    Ties at the cut-off are broken by ``hash_uniform(seed, key, sentence_index)`` (lowest first): deterministic
    and independent of part order, yet spread over the corpus. Breaking them by key order instead would keep
    all of a coarse detector's tied units (e.g. every ``oracle`` 100) from the first images only, and a CLIP
    fine-tuned on that sees a fraction of the images."""
    if n <= 0:
        return np.empty(0, np.int64), None
    if n >= len(score):
        return np.arange(len(score)), float(score.min()) if len(score) else None
    cut = np.partition(score, len(score) - n)[len(score) - n]
    above = np.flatnonzero(score > cut)
    ties = np.flatnonzero(score == cut)
    need = n - len(above)
    if need < len(ties):
        sub = table.select(["key", "sentence_index"]).take(pa.array(rows[ties]))
        h = np.fromiter((hash_uniform(seed, k, i) for k, i in zip(sub["key"].to_pylist(),
                                                                   sub["sentence_index"].to_pylist())),
                        np.float64, len(ties))
        ties = ties[np.argsort(h, kind="stable")[:need]]
    return np.sort(np.concatenate([above, ties])), float(cut)


def _aggregate(t: pa.Table, agg: str) -> pa.Table:
    """Sentence scores -> one row per caption (sentence_index = -1)."""
    cols = ["key"] + (["captioner"] if "captioner" in t.column_names else [])
    if agg == "prob":
        p = pc.max_element_wise(pc.divide(pc.cast(t["score"], pa.float64()), 100.0), 1e-9)
        t = t.append_column("_logp", pc.ln(p))
        g = t.group_by(cols, use_threads=False).aggregate([("_logp", "sum")])
        score = pc.multiply(pc.exp(g["_logp_sum"]), 100.0)
    else:
        g = t.group_by(cols, use_threads=False).aggregate([("score", agg)])
        score = g[f"score_{agg}"]
    out = {c: g[c] for c in cols}
    out["sentence_index"] = pa.array(np.full(len(g), CAPTION_INDEX, np.int32))
    out["score"] = pc.cast(score, pa.float64())
    return pa.table(out)


def _random_scores(t: pa.Table, seed: int) -> np.ndarray:
    """Uniform scores assigned in (key, sentence_index) order: independent of part order."""
    order = pc.sort_indices(t, [("key", "ascending"), ("sentence_index", "ascending")]).to_numpy()
    r = np.empty(len(t))
    r[order] = np.random.default_rng(seed).random(len(t))
    return r


def check_amount(keep: float | None, top_k: int | None, threshold: float | None, unit: str, agg: str) -> None:
    """Raise :class:`SelectError` unless exactly one of keep / top_k / threshold is given and valid, and unit and
    agg are known."""
    given = [x is not None for x in (keep, top_k, threshold)]
    if sum(given) != 1:
        raise SelectError("give exactly one of keep (fraction), top_k (count) or threshold (score)")
    if keep is not None and not 0 < keep <= 1:
        raise SelectError(f"keep={keep}: expected a fraction in (0, 1]")
    if top_k is not None and top_k < 0:
        raise SelectError(f"top_k={top_k}: expected >= 0")
    if threshold is not None and not 0 <= threshold <= 100:  # also refuses nan
        raise SelectError(f"threshold={threshold}: expected a score in [0, 100]")
    if unit not in UNITS:
        raise SelectError(f"unit={unit!r}: expected one of {UNITS}")
    if agg not in AGGS:
        raise SelectError(f"agg={agg!r}: expected one of {AGGS}")


def select_keys(scores: str | os.PathLike | pa.Table, *, keep: float | None = None, top_k: int | None = None,
                threshold: float | None = None, unit: str = "sentence", agg: str = "min",
                per_captioner: bool = False, random_baseline: bool = False, seed: int = 0,
                captioners: pa.Table | None = None) -> tuple[pa.Table, dict]:
    """Pick the kept units from a score table; returns ``(kept, info)``.

    ``kept`` has ``key``, ``sentence_index`` (-1 for whole captions), ``score`` (and ``captioner``), sorted
    by key and sentence_index. ``info`` holds the threshold actually used and candidate/kept counts.
    """
    check_amount(keep, top_k, threshold, unit, agg)
    if isinstance(scores, pa.Table):
        t = scores
    else:
        t = read_scores(scores, columns=["key", "sentence_index", "score"])
        if per_captioner and captioners is None:
            try:
                t = read_scores(scores, columns=["key", "sentence_index", "score", "captioner"])
            except Exception:  # noqa: BLE001 - older tables without the column: caller passes `captioners`
                pass
    if per_captioner and "captioner" not in t.column_names:
        if captioners is None:
            raise SelectError("per_captioner: the score table has no 'captioner' column; pass captioners")
        t = t.join(captioners, "key", join_type="left outer")
    n_rows = len(t)
    caption_level = pc.equal(t["sentence_index"], CAPTION_INDEX)
    n_caption_rows = pc.sum(caption_level).as_py() or 0
    if unit == "sentence" or agg in SENTENCE_AGGS:
        if n_caption_rows:
            if n_caption_rows == n_rows:
                raise SelectError("scores are caption-level (scored with unit=caption): use unit='caption' "
                                  "with agg min/mean/prob")
            t = t.filter(pc.invert(caption_level))
    elif n_caption_rows == n_rows:
        pass  # already one score per caption
    else:
        t = _aggregate(t.filter(pc.invert(caption_level)), agg)
    score = t["score"].to_numpy().astype(np.float64)
    groups = ([("all", np.arange(len(t)))] if not per_captioner else
              [(str(c), np.flatnonzero(pc.equal(t["captioner"], c).to_numpy(zero_copy_only=False)))
               for c in sorted(pc.unique(t["captioner"]).to_pylist(), key=str)])
    if random_baseline:
        rand = _random_scores(t, seed)
    kept_idx, thresholds = [], {}
    for name, idx in groups:
        s = score[idx]
        n = (int(np.floor(keep * len(idx) + 0.5)) if keep is not None else min(top_k, len(idx)) if top_k is not None
             else int((s >= threshold).sum()))
        if random_baseline:
            sel, _ = _top_n(rand[idx], n, t, idx)
            thresholds[name] = None
        elif threshold is not None:
            sel = np.flatnonzero(s >= threshold)
            thresholds[name] = float(threshold)
        else:
            sel, thresholds[name] = _top_n(s, n, t, idx, seed)
        kept_idx.append(idx[sel])
    kept_idx = np.sort(np.concatenate(kept_idx)) if kept_idx else np.empty(0, np.int64)
    kept = t.take(pa.array(kept_idx))
    kept = kept.take(pc.sort_indices(kept, [("key", "ascending"), ("sentence_index", "ascending")]))
    info = {"score_rows": n_rows, "candidates": len(t), "selected": len(kept),
            "threshold_used": thresholds if per_captioner else thresholds.get("all")}
    return kept, info


def _precision(c: Counter) -> float | None:
    """Share of correct among the labelled (correct + incorrect) units, as a percentage (0–100)."""
    denom = c["correct"] + c["incorrect"]
    return percent(c["correct"] / denom, 4) if denom else None


def select(scores_dir: str | os.PathLike, data, out_dir: str | os.PathLike, *, keep: float | None = None,
           top_k: int | None = None, threshold: float | None = None, unit: str = "sentence", agg: str = "min",
           per_captioner: bool = False, random_baseline: bool = False, seed: int = 0, maxcount: int = 1000,
           show_progress: bool = True, meta_defaults: dict[str, str] | None = None, detector: str | None = None,
           allow_partial: bool = False, compose=None) -> dict:
    """Select from ``scores_dir`` and write the kept units of the shards ``data`` into ``out_dir``.

    Returns the manifest (also written to ``out_dir/manifest.json``). Keys present only in the scores or only
    in the shards are counted and reported (with examples), never silently dropped. A sample whose json lacks
    ``captioner`` / ``source`` (img2dataset output) gets ``meta_defaults`` (default :data:`META_DEFAULTS`);
    the manifest records the defaults and how many samples took them. Raises :class:`SelectError` naming the
    first failure when units were kept but not one sample could be written. On an error nothing this call wrote
    is left in ``out_dir``; after a kill, the same call writes the selection again (to the same bytes), and one
    that finds it complete returns its manifest as it is (:func:`halsift.filtering.selection.guard.prepare`).
    ``compose``: a :class:`halsift.filtering.selection.compose.Composition` (its first folder is ``scores_dir``):
    select among its candidates, ranked by its rank; the manifest's ``composition`` has its accounting.
    """
    defaults = {**META_DEFAULTS, **(meta_defaults or {})}
    t0 = time.perf_counter()
    check_amount(keep, top_k, threshold, unit, agg)
    if maxcount < 1:
        raise SelectError(f"maxcount={maxcount}: expected >= 1")
    args = dict(keep=keep, top_k=top_k, threshold=threshold, unit=unit, agg=agg, per_captioner=per_captioner,
                random_baseline=random_baseline, seed=seed)
    if compose is not None and per_captioner:
        raise SelectError("per_captioner: not with a composed selection (--where/--rank/--fields/--exclude or "
                          "several --scores)")
    extra = {"compose": compose.record()} if compose is not None else {}
    prep = prepare(scores_dir, data, out_dir, {**args, "engine": "memory", "keys_only": False, "maxcount": maxcount,
                                               **extra}, detector=detector, allow_partial=allow_partial,
                   meta_defaults=defaults)
    if prep.done is not None:
        return prep.done  # this selection, complete: as it is
    out, shards, filt = prep.out, prep.shards, prep.filt
    try:
        clear_outputs(out)  # what an unfinished run of this selection wrote: written again, to the same bytes
        write_json_atomic(out / "manifest.json", {"status": "running", "filter": filt})
        table, source = load_scores(scores_dir, detector, allow_partial, captioner=per_captioner, folder=prep.folder)
        try:
            if compose is not None:  # the composed candidates, ranked
                cands, accounting = compose.candidates(unit, agg)
                kept, info = select_keys(cands, **args)
                info["composition"] = accounting
            else:
                kept, info = select_keys(table, **args)
        except SelectError as e:
            if not (per_captioner and "captioner" in str(e)):
                raise
            # score tables without a captioner column: read it from the shards' json (one extra pass)
            pairs = [(smp.key, smp.captioner) for path in shards for smp in iter_shard(path, SkipCounter())]
            caps = pa.table({"key": [k for k, _ in pairs], "captioner": [c for _, c in pairs]})
            kept, info = select_keys(table, **args, captioners=caps)
        repairs = None
        if agg == "repair":
            from halsift.filtering.selection.repair import flagged_spans

            repairs = flagged_spans(scores_dir, kept)
        manifest = _write_selection(table, kept, info, source, filt, shards, out, unit, agg, maxcount, show_progress,
                                    defaults, repairs)
    except BaseException:
        remove_selection(out, prep.created)
        raise
    manifest["scores_check"] = prep.checks
    manifest["wall_time_s"] = round(time.perf_counter() - t0, 3)
    write_json_atomic(out / "manifest.json", manifest)
    return manifest


def unit_outputs(s: Sample, idxs: list[int], unit: str, agg: str, texts: list[str], gts: list | None,
                 defaults: dict) -> list[Sample]:
    """The output samples of one kept source sample: one per kept sentence (``unit=sentence``), its caption
    pruned to the kept sentences (``agg=prune``) or the whole caption; json fields the sample lacks (e.g.
    img2dataset's ``captioner``) are taken from ``defaults``."""
    missing = {k: v for k, v in defaults.items() if k not in s.meta}
    base = {**missing, **{k: v for k, v in s.meta.items() if k not in ("key", "sentences")}}
    if unit == "sentence":
        outs = []
        for i in idxs:
            meta = {**base, "parent_key": s.key, "sentence_index": i}
            if gts is not None:
                meta["sentences"] = [{**gts[i], "position": 0}]
            outs.append(Sample(f"{s.key}_s{i}", s.image, texts[i], meta, s.ext or "jpg"))
        return outs
    if agg == "prune":
        meta = {**base, "kept_sentence_indices": idxs}
        if gts is not None:
            meta["sentences"] = [{**gts[i], "position": j} for j, i in enumerate(idxs)]
        return [Sample(s.key, s.image, " ".join(texts[i] for i in idxs), meta, s.ext or "jpg")]
    meta = {**missing, **s.meta}
    meta.pop("key", None)
    return [Sample(s.key, s.image, s.caption, meta, s.ext or "jpg")]


class KeptCounts:
    """Per captioner: the label counts of the input units and of the kept units, the kept units and samples; the
    manifest's precision fields. Shared by :func:`select` and the resumable select's shards (which store it as JSON
    per shard and merge it)."""

    def __init__(self, sentence_level: bool) -> None:
        self.sentence_level = sentence_level
        self.inp: defaultdict[str, Counter] = defaultdict(Counter)
        self.got: defaultdict[str, Counter] = defaultdict(Counter)
        self.units: Counter = Counter()
        self.samples: Counter = Counter()
        self.sentences = {"input": Counter(), "kept": Counter()}  # sentence labels whatever the unit

    def add_source(self, cap: str, labels: list) -> None:
        """One source sample read: its units' labels count for the input precision."""
        self.inp[cap].update(x for x in (labels if self.sentence_level else [_caption_label(labels)]) if x)
        self.sentences["input"].update(x for x in labels if x)

    def add_kept(self, cap: str, labels: list, idxs: list[int]) -> None:
        """One source sample written with its kept sentences ``idxs`` (the whole caption when not sentence-level)."""
        written = [labels[i] for i in idxs] if self.sentence_level else labels  # sentences of the written text
        self.sentences["kept"].update(x for x in written if x)
        if self.sentence_level:
            self.got[cap].update(x for x in written if x)
            self.units[cap] += len(idxs)
        else:
            lab = _caption_label(labels)
            self.got[cap].update([lab] if lab else [])
            self.units[cap] += 1
        self.samples[cap] += 1

    def to_json(self) -> dict:
        return {"input": {c: dict(v) for c, v in self.inp.items()}, "kept": {c: dict(v) for c, v in self.got.items()},
                "kept_units": dict(self.units), "kept_samples": dict(self.samples),
                "sentences": {k: dict(v) for k, v in self.sentences.items()}}

    def merge_json(self, d: dict) -> None:
        for c, v in d["input"].items():
            self.inp[c].update(v)
        for c, v in d["kept"].items():
            self.got[c].update(v)
        self.units.update(d["kept_units"])
        self.samples.update(d["kept_samples"])
        for k, v in d.get("sentences", {}).items():
            self.sentences[k].update(v)

    def manifest_fields(self) -> dict:
        total_in, total_kept = sum(self.inp.values(), Counter()), sum(self.got.values(), Counter())
        caps = sorted(set(self.inp) | set(self.units))
        return {"kept_units": sum(self.units.values()), "source_samples_kept": sum(self.samples.values()),
                "kept_units_per_captioner": {c: self.units[c] for c in caps},
                "scale": SCALE,  # the precision fields are percentages (manifests without it: shares, 0–1)
                "precision": {"input": _precision(total_in), "kept": _precision(total_kept),
                              **{f"input/{c}": _precision(self.inp[c]) for c in caps},
                              **{f"kept/{c}": _precision(self.got[c]) for c in caps}},
                "labelled_units": {"input": total_in["correct"] + total_in["incorrect"],
                                   "kept": total_kept["correct"] + total_kept["incorrect"]},
                # share of correct sentences in the kept text, whatever the unit (a whole caption's
                # ``precision`` above counts it correct only when every sentence is)
                "sentence_precision": {k: _precision(v) for k, v in self.sentences.items()}}


def kept_by_key(kept: pa.Table) -> dict[str, list[int]]:
    """Key -> its kept sentence indices (-1 for a whole caption)."""
    want: dict[str, list[int]] = defaultdict(list)
    for k, i in zip(kept["key"].to_pylist(), kept["sentence_index"].to_pylist()):
        want[k].append(i)
    return want


def key_overlap(shard_keys: pa.Array, score_keys: pa.Array, examples: int = 20) -> dict:
    """The manifest's ``keys``: how many keys are only in the shards / only in the scores, with examples."""
    shard_only = pc.filter(shard_keys, pc.invert(pc.is_in(shard_keys, value_set=score_keys)))
    score_only = pc.filter(score_keys, pc.invert(pc.is_in(score_keys, value_set=shard_keys)))
    return {"shards": len(shard_keys), "scores": len(score_keys),
            "only_in_shards": len(shard_only), "only_in_scores": len(score_only),
            "only_in_shards_examples": shard_only.slice(0, examples).to_pylist(),
            "only_in_scores_examples": score_only.slice(0, examples).to_pylist()}


class _SelectionWriter:
    """:func:`select`'s single pass over the shards: writes each kept source sample's outputs, counts the rest."""

    def __init__(self, writer: ShardWriter, want: dict[str, list[int]], source: dict, filt: dict, unit: str,
                 agg: str, defaults: dict) -> None:
        self.writer, self.want, self.source, self.filt = writer, want, source, filt
        self.unit, self.agg, self.defaults = unit, agg, defaults
        self.counts = KeptCounts(unit == "sentence" or agg in SENTENCE_AGGS)
        self.repairs: dict | None = None  # agg repair: key -> {flagged sentence index: spans to cut}
        self.repaired = 0
        self.skipped = SkipCounter(max_examples=1000)
        self.defaulted: Counter = Counter()
        self.corrupt_shards: list[str] = []
        self.shard_keys: list[pa.Array] = []

    def shard(self, path: Path, bar) -> None:
        keys_here: list[str] = []
        try:
            for s in iter_shard(path, self.skipped):
                bar.update(1)
                keys_here.append(s.key)
                self.sample(s, path)
        except ShardFormatError as e:
            self.corrupt_shards.append(f"{path.name}: {e}")
            self.skipped.add(path.name, str(e), "corrupt_shard", n=e.lost or 1)
        self.shard_keys.append(pa.array(keys_here, pa.string()))

    def sample(self, s: Sample, path: Path) -> None:
        texts, labels, gts = _labels(s.meta, s.caption)
        self.counts.add_source(s.captioner, labels)
        if s.key not in self.want and not (self.repairs and s.key in self.repairs):
            return
        idxs = sorted(set(self.want.get(s.key, [])))
        if self.counts.sentence_level and any(not 0 <= i < len(texts) for i in idxs):
            bad = next(i for i in idxs if not 0 <= i < len(texts))
            held = parts_holding([Path(x) for x in self.source["parts"]], s.key, bad)
            raise SelectError(f"scores: {held[0] if held else self.filt['scores']} has sentence_index {bad} for key "
                              f"{s.key!r}, whose caption in {path} has {len(texts)} sentence(s); were these scores "
                              "made from other shards?")
        self.defaulted.update(k for k in self.defaults if k not in s.meta)
        if self.repairs is not None:
            self._repair(s, idxs, texts, labels, gts)
            return
        if write_outputs(self.writer, unit_outputs(s, idxs, self.unit, self.agg, texts, gts, self.defaults),
                         self.skipped):
            self.counts.add_kept(s.captioner, labels, idxs)


    def _repair(self, s: Sample, idxs: list[int], texts: list[str], labels: list, gts: list | None) -> None:
        from halsift.filtering.selection.repair import repair_outputs

        missing = {k: v for k, v in self.defaults.items() if k not in s.meta}
        base = {**missing, **{k: v for k, v in s.meta.items() if k not in ("key", "sentences")}}
        outs, written, new_labels = repair_outputs(s, idxs, self.repairs.get(s.key, {}), texts, gts, base)
        if outs and write_outputs(self.writer, outs, self.skipped):
            full = list(labels)
            for i, lab in zip(written, new_labels or [None] * len(written)):
                full[i] = lab
            self.counts.add_kept(s.captioner, full, written)
            self.repaired += len(outs[0].meta["repaired_sentence_indices"])


def _write_selection(table: pa.Table, kept: pa.Table, info: dict, source: dict, filt: dict, shards: list[Path],
                     out: Path, unit: str, agg: str, maxcount: int, show_progress: bool, defaults: dict,
                     repairs: dict | None = None) -> dict:
    """Stream the shards once, writing the kept units (json fields a sample lacks taken from ``defaults``);
    returns the manifest (without wall time)."""
    bar = progress(desc="select", unit="sample", disable=not show_progress)
    with ShardWriter(out, maxcount=maxcount) as writer:
        w = _SelectionWriter(writer, kept_by_key(kept), source, filt, unit, agg, defaults)
        w.repairs = repairs
        for path in shards:
            w.shard(path, bar)
    bar.close()
    if len(kept) and not writer.total:
        bad = next((e for e in w.skipped.examples if e["kind"] == "bad_sample"), None)
        why = (w.corrupt_shards[0] if w.corrupt_shards else f"sample {bad['key']!r}: {bad['reason']}" if bad else
               f"no kept key is in the shards (e.g. {kept['key'][0].as_py()!r}): scores of other data?")
        raise SelectError(f"data: {len(kept)} units kept but no sample could be written; {why}")
    shard_keys = pa.concat_arrays(w.shard_keys) if w.shard_keys else pa.array([], pa.string())
    cols = ["key", "sentence_index", "score"] + (["captioner"] if filt["per_captioner"] else [])
    write_part_atomic(kept.select([c for c in cols if c in kept.column_names]), out / "kept.parquet")
    return {"status": "complete", "engine": "memory", "filter": filt, **info, "samples_written": writer.total,
            **w.counts.manifest_fields(), "keys": key_overlap(shard_keys, pc.unique(table["key"])),
            "skipped": w.skipped.to_json(), "corrupt_shards": w.corrupt_shards,
            "meta_defaults": {"values": defaults, "samples": dict(sorted(w.defaulted.items()))},
            **({"repaired_sentences": w.repaired} if repairs is not None else {})}


def read_kept(out_dir: str | os.PathLike) -> pa.Table:
    """The kept-units table of a selection folder."""
    return pq.read_table(Path(out_dir) / "kept.parquet")
