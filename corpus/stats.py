"""Per-generator statistics of annotated sentences (the seeds' Table 1 and Fig. 4), from a bench or from shards.

For each generator: sentences, captions, sentences per caption, % correct / incorrect / unknown, the incorrect
rate over labelled sentences (unknown excluded, as the papers count it), words per sentence, the number of
incorrect sentences per hallucination type, and the incorrect rate by sentence position (0-based keys, matching
the bench ``position``). Shards are read through their ground-truth ``sentences``; samples without them are
skipped and counted, as are the samples the shard reader leaves out (a key repeated in its shard: ``duplicate``;
a caption that is not valid UTF-8: ``bad_caption``).
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

from .bench import LABELS, TYPES, iter_bench
from .images import SkipCounter
from .percent import percent
from .shards import expand_shards, iter_shard

TOTAL = "all"


def _bench_file(path: Path) -> Path | None:
    if path.is_file() and path.suffix == ".jsonl":
        return path
    for cand in (path / "bench.jsonl", path / "bench" / "bench.jsonl"):
        if path.is_dir() and cand.is_file():
            return cand
    return None


def _records(path: str | os.PathLike, skipped: Counter) -> tuple[str, Iterator[tuple]]:
    """(kind, iterator of (generator, generator_type, caption_id, position, label, types, n_words))."""
    p = Path(path)
    bench = _bench_file(p)
    if bench is not None:
        def from_bench():
            for r in iter_bench(bench):
                yield r.generator, r.generator_type, r.caption_id, r.position, r.label, r.types, len(r.sentence.split())
        return "bench", from_bench()

    def from_shards():
        read = SkipCounter(max_examples=0)
        for s in (s for shard in expand_shards(path) for s in iter_shard(shard, read)):
            sents = s.meta.get("sentences")
            if s.meta.get("_bad_json"):
                skipped["bad_json"] += 1
                continue
            if not isinstance(sents, list):
                skipped["no_sentences"] += 1
                continue
            for k, sent in enumerate(sents):
                try:
                    label = sent["label"]
                    text = sent["text"]
                    if label not in LABELS:
                        raise ValueError(label)
                except (KeyError, TypeError, ValueError):
                    skipped["bad_sentence"] += 1
                    continue
                yield (s.captioner, s.source, f"{s.shard}/{s.key}", int(sent.get("position", k)), label,
                       list(sent.get("types", [])), len(text.split()))
        skipped.update(read.counts)
    return "shards", from_shards()


def _pct(a: int, b: int) -> float:
    return percent(a / b, 2) if b else 0.0


def stats(path: str | os.PathLike) -> dict:
    """Statistics of a ``bench.jsonl`` (or a folder holding one, or a world folder) or of shards (folder, glob,
    brace pattern). Returns ``{"kind", "path", "generators": {name: {...}}, "skipped": {...}}`` with an extra
    generator ``"all"`` over everything; percentages are on a 0-100 scale."""
    skipped: Counter = Counter()
    kind, records = _records(path, skipped)
    acc: dict[str, dict] = defaultdict(lambda: {"type": "", "labels": Counter(), "captions": set(), "words": 0,
                                                "types": Counter(), "pos_inc": Counter(), "pos_lab": Counter()})
    for gen, gtype, cap, pos, label, types, n_words in records:
        for name in (gen, TOTAL):
            a = acc[name]
            a["type"] = gtype if name != TOTAL else "all"
            a["labels"][label] += 1
            a["captions"].add(cap)
            a["words"] += n_words
            if label == "incorrect":
                a["types"].update(types)
                a["pos_inc"][pos] += 1
            if label != "unknown":
                a["pos_lab"][pos] += 1
    gens = {}
    for name in sorted(acc, key=lambda n: (n == TOTAL, acc[n]["type"], n)):
        a = acc[name]
        n = sum(a["labels"].values())
        labelled = a["labels"]["correct"] + a["labels"]["incorrect"]
        gens[name] = {
            "generator_type": a["type"],
            "sentences": n,
            "captions": len(a["captions"]),
            "sentences_per_image": round(n / len(a["captions"]), 2) if a["captions"] else 0.0,
            "pct_correct": _pct(a["labels"]["correct"], n),
            "pct_incorrect": _pct(a["labels"]["incorrect"], n),
            "pct_unknown": _pct(a["labels"]["unknown"], n),
            "incorrect_rate": _pct(a["labels"]["incorrect"], labelled),
            "words_per_sentence": round(a["words"] / n, 2) if n else 0.0,
            "types": {t: a["types"][t] for t in TYPES},
            "incorrect_rate_by_position": {str(p): _pct(a["pos_inc"][p], a["pos_lab"][p])
                                           for p in sorted(a["pos_lab"])},
            "labelled_by_position": {str(p): a["pos_lab"][p] for p in sorted(a["pos_lab"])},
            "incorrect_by_position": {str(p): a["pos_inc"][p] for p in sorted(a["pos_lab"])},
        }
    if not gens:
        raise ValueError(f"stats: {path} holds no annotated sentences")
    return {"kind": kind, "path": str(path), "generators": gens, "skipped": dict(skipped)}


def format_table(st: dict, max_positions: int = 8) -> str:
    """A plain-text table in the layout of the seeds' Table 1 (generators as columns), with type counts and
    the incorrect rate by position (#1 = first sentence; the last row pools positions beyond ``max_positions``)."""
    gens = st["generators"]
    names = list(gens)
    rows: list[tuple[str, list[str]]] = [
        ("type", [gens[n]["generator_type"] for n in names]),
        ("sentences", [str(gens[n]["sentences"]) for n in names]),
        ("sentences / image", [f"{gens[n]['sentences_per_image']:.1f}" for n in names]),
        ("correct %", [f"{gens[n]['pct_correct']:.1f}" for n in names]),
        ("incorrect %", [f"{gens[n]['pct_incorrect']:.1f}" for n in names]),
        ("unknown %", [f"{gens[n]['pct_unknown']:.1f}" for n in names]),
        ("incorrect / labelled %", [f"{gens[n]['incorrect_rate']:.1f}" for n in names]),
        ("words / sentence", [f"{gens[n]['words_per_sentence']:.1f}" for n in names]),
    ]
    rows += [(f"  {t}", [str(gens[n]["types"][t]) for n in names]) for t in TYPES]
    for p in range(max_positions + 1):
        cells = []
        for n in names:
            inc, lab = 0, 0
            for k, c in gens[n]["labelled_by_position"].items():
                if int(k) == p or (p == max_positions and int(k) > p):
                    lab += c
                    inc += gens[n]["incorrect_by_position"][k]
            cells.append(f"{percent(inc / lab):.1f}" if lab else "-")
        label = f"  incorrect % at #{p + 1}" + ("+" if p == max_positions else "")
        rows.append((label, cells))
    head_w = max(len(r[0]) for r in rows)
    col_w = [max(len(n), *(len(r[1][i]) for r in rows)) for i, n in enumerate(names)]
    lines = [" ".join([" " * head_w] + [n.rjust(w) for n, w in zip(names, col_w)])]
    lines.append("-" * len(lines[0]))
    for label, cells in rows:
        if label == "  Object":
            lines.append("incorrect sentences by type")
        if label == "  incorrect % at #1":
            lines.append("incorrect rate by position")
        lines.append(" ".join([label.ljust(head_w)] + [c.rjust(w) for c, w in zip(cells, col_w)]))
    if st.get("skipped"):
        lines.append("skipped: " + ", ".join(f"{k}={v}" for k, v in sorted(st["skipped"].items())))
    return "\n".join(lines)


def to_json(st: dict) -> str:
    return json.dumps(st, indent=2, sort_keys=True)
