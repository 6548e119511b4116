"""``--unit caption --agg repair``: repair captions instead of dropping them.

The sentences are selected as ``prune`` selects them (the top fraction / top-k / above-threshold sentences); each
caption is then written with its kept sentences as they are and, for a flagged sentence (not kept) whose detector
localized the hallucination (a score part's ``spans`` column: [start_word, end_word) of the whitespace words), the
sentence without those words. A flagged sentence without spans is removed, as prune removes it. A caption with
nothing left is dropped. The written sentence records say which were repaired (``repaired``); a repaired sentence's
ground truth (synthetic worlds, labelled shards) counts as correct when the removed words cover every labelled span
of it, else it keeps its label.
"""

from __future__ import annotations

import os
from collections import defaultdict

import pyarrow as pa
import pyarrow.compute as pc

from halsift.corpus.sentences import words
from halsift.corpus.shards import Sample


def cut_spans(sentence: str, spans: list[list[int]]) -> str:
    """``sentence`` without the words ``spans`` cover (whitespace words, re-joined by single spaces)."""
    gone = {j for s, e in spans for j in range(int(s), int(e))}
    return " ".join(w for j, w in enumerate(words(sentence)) if j not in gone)


def repaired_label(truth: dict | None, spans: list[list[int]]) -> str | None:
    """The label of a sentence after ``spans`` are cut: correct when they cover each labelled span of an
    incorrect sentence (one with spans), else its label as it was."""
    if truth is None:
        return None
    label = truth.get("label")
    marked = truth.get("spans") or []
    if label == "incorrect" and marked:
        cut = {j for s, e in spans for j in range(int(s), int(e))}
        if all(set(range(int(s), int(e))) <= cut for s, e in marked):
            return "correct"
    return label


def flagged_spans(scores: str | os.PathLike | pa.Table, kept: pa.Table) -> dict[str, dict[int, list]]:
    """Key -> {sentence_index: spans} of the sentences a localizing detector flagged with non-empty spans and the
    selection did not keep (empty when the parts have no ``spans`` column)."""
    if isinstance(scores, pa.Table):
        t = scores
    else:
        from halsift.corpus.scores import read_scores
        import pyarrow.parquet as pq
        from pathlib import Path

        p = Path(scores)
        first = next(iter(sorted(p.glob("*.parquet")))) if p.is_dir() else p
        if "spans" not in pq.read_schema(first).names:
            return {}
        t = read_scores(scores, ["key", "sentence_index", "spans"])
    if "spans" not in t.column_names:
        return {}
    t = t.filter(pc.greater(pc.list_value_length(t["spans"]), 0))
    kept_set = set(zip(kept["key"].to_pylist(), kept["sentence_index"].to_pylist()))
    out: dict[str, dict[int, list]] = defaultdict(dict)
    for k, i, sp in zip(t["key"].to_pylist(), t["sentence_index"].to_pylist(), t["spans"].to_pylist()):
        if (k, i) not in kept_set:
            out[k][int(i)] = [list(x) for x in sp]
    return dict(out)


def repair_outputs(s: Sample, idxs: list[int], repairs: dict[int, list], texts: list[str], gts: list | None,
                   base: dict) -> tuple[list[Sample], list[int], list[str | None] | None]:
    """The repaired caption of a source sample: ``([sample] or [], written sentence indices, their labels)``.
    ``idxs``: kept sentences; ``repairs``: sentence index -> spans to cut from a flagged sentence."""
    kept = set(idxs)
    parts, written, labels, records, repaired = [], [], [], [], []
    for i, text in enumerate(texts):
        truth = gts[i] if gts is not None else None
        if i in kept:
            new, lab = text, (truth or {}).get("label")
        elif i in repairs:
            new, lab = cut_spans(text, repairs[i]), repaired_label(truth, repairs[i])
            if not new:
                continue
            repaired.append(i)
        else:
            continue
        parts.append(new)
        written.append(i)
        labels.append(lab)
        if truth is not None:
            rec = {**truth, "text": new, "position": len(records), "label": lab}
            if i in repaired:
                rec["repaired"], rec["spans"] = True, []
            records.append(rec)
    if not parts:
        return [], [], None
    meta = {**base, "kept_sentence_indices": [i for i in written if i in kept], "repaired_sentence_indices": repaired}
    if gts is not None:
        meta["sentences"] = records
    return [Sample(s.key, s.image, " ".join(parts), meta, s.ext or "jpg")], written, labels if gts is not None else None
