"""Converter from the AlignBench per-sentence table to our benchmark rows (``bench.jsonl``, corpus/bench.py).

AlignBench releases one row per annotated sentence with the columns
``model, image_source, image_name, sentence_index, caption, annotation, error_type, error_words,
n_correct, n_incorrect, n_unknown`` (CSV, parquet or JSONL). Per the paper (seeds/alignbench.txt, §3.2 and
Table B): ``annotation`` is the sentence label (correct / incorrect / unknown, majority of five annotators,
then reviewed), ``error_type`` one or more of Object, Attribute, Number, Text, Relation, Location, Direction,
Illusion, Other, ``error_words`` the hallucinated segment(s), and ``n_*`` the annotator votes (kept in
``extra`` for Fleiss' kappa).

Choices made here (the release does not pin them):
* ``caption`` is the sentence text; the whole caption is its sentences joined by one space in
  ``sentence_index`` order. If the table also has a ``sentence`` column, that is the sentence and
  ``caption`` the whole caption.
* ``sentence_index`` may be 0- or 1-based: with ``index_base="auto"`` the smallest index in the table is
  taken as the base. Our ``position`` is 0-based.
* ``error_type`` may be a list or a string separated by ``,``/``;``/``|``/``/``; names match our TYPES
  case-insensitively and anything else (``Unknown``, ``More``) becomes ``Other``.
* ``error_words`` (a list or a string) become ``[start_word, end_word)`` spans of ``words(sentence)``
  (whitespace words, matched ignoring case and edge punctuation). A string is first tried whole, then split
  on ``;``/``|``/newlines and then on commas. Phrases not found are kept in ``extra`` and counted.
* ``generator_type`` is ``t2i`` for the text-to-image models (Stable Diffusion 3.5 "SD", gpt-image-1
  "GPT-Gen") and ``i2t`` for every captioner.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

from halsift.corpus.bench import TYPES, BenchRow, write_bench
from halsift.corpus.sentences import find_word_span

COLUMNS = ("model", "image_source", "image_name", "sentence_index", "caption", "annotation", "error_type",
           "error_words", "n_correct", "n_incorrect", "n_unknown")
T2I_MODEL_RE = re.compile(r"^sd\b|^sd[-_ ]?3|stable[-_ ]?diffusion|gpt[-_ ]?gen|gpt[-_ ]?image", re.I)

_LABELS = {
    "correct": "correct", "positive": "correct", "true": "correct", "yes": "correct", "1": "correct",
    "1.0": "correct", "o": "correct", "aligned": "correct",
    "incorrect": "incorrect", "negative": "incorrect", "false": "incorrect", "no": "incorrect", "0": "incorrect",
    "0.0": "incorrect", "x": "incorrect", "hallucination": "incorrect", "hallucinated": "incorrect",
    "wrong": "incorrect",
    "unknown": "unknown", "unk": "unknown", "?": "unknown", "unsure": "unknown", "n/a": "unknown",
}
_TYPES_LOWER = {t.lower(): t for t in TYPES}


class AlignBenchFormatError(ValueError):
    """The AlignBench table breaks its format; the message names the file, row and column."""


def generator_type(model: str) -> str:
    """``t2i`` for the text-to-image models (SD 3.5, GPT-Gen / gpt-image-1), ``i2t`` otherwise."""
    return "t2i" if T2I_MODEL_RE.search(model.strip()) else "i2t"


def read_table(path: str | os.PathLike):
    """Read a CSV/TSV, parquet or JSONL/JSON table into a pandas DataFrame."""
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"AlignBench table: {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return pd.read_parquet(path)
    if suffix in (".jsonl", ".ndjson"):
        return pd.read_json(path, lines=True, dtype=False)
    if suffix == ".json":
        return pd.read_json(path, dtype=False)
    if suffix in (".csv", ".tsv"):
        return pd.read_csv(path, sep="\t" if suffix == ".tsv" else ",", dtype=str, keep_default_na=False)
    raise AlignBenchFormatError(f"{path}: unknown table format {suffix!r}, expected .csv/.tsv/.parquet/.jsonl/.json")


def _missing(v) -> bool:
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return isinstance(v, str) and not v.strip()


def _as_list(v) -> list:
    """A list-like cell (list, tuple, numpy array) as a list; anything else as None."""
    if isinstance(v, (list, tuple)):
        return list(v)
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        out = v.tolist()
        return out if isinstance(out, list) else None
    return None


def map_types(value) -> list[str]:
    """Map an ``error_type`` cell to our TYPES (case-insensitive; unknown names -> ``Other``), deduplicated."""
    items = _as_list(value)
    if items is None:
        items = [] if _missing(value) else re.split(r"[,;|/]", str(value))
    out: list[str] = []
    for it in items:
        if _missing(it):
            continue
        t = _TYPES_LOWER.get(str(it).strip().lower(), "Other")
        if t not in out:
            out.append(t)
    return out


def map_label(value, where: str) -> str:
    """Map an ``annotation`` cell to correct / incorrect / unknown."""
    if isinstance(value, bool):
        return "correct" if value else "incorrect"
    key = "" if _missing(value) else str(value).strip().lower()
    if key not in _LABELS:
        raise AlignBenchFormatError(f"{where}: column 'annotation' is {value!r}, expected correct/incorrect/unknown "
                                    f"(or one of {sorted(_LABELS)})")
    return _LABELS[key]


def error_word_spans(sentence: str, value) -> tuple[list[list[int]], list[str]]:
    """Word spans of the ``error_words`` cell in ``sentence``, and the phrases that could not be found."""
    items = _as_list(value)
    if items is None:
        if _missing(value):
            return [], []
        text = str(value).strip()
        if find_word_span(sentence, text) is not None:
            items = [text]
        else:
            items = [p for chunk in re.split(r"[;|\n]", text) for p in
                     ([chunk] if find_word_span(sentence, chunk) else chunk.split(","))]
    spans: list[list[int]] = []
    unmatched: list[str] = []
    after = 0
    for phrase in items:
        if _missing(phrase):
            continue
        phrase = str(phrase).strip()
        # prefer the next occurrence after the previous span (repeated words), else the first one
        hit = find_word_span(sentence, phrase, after) or find_word_span(sentence, phrase)
        if hit is None:
            unmatched.append(phrase)
            continue
        if list(hit) not in spans:
            spans.append(list(hit))
        after = hit[1]
    return sorted(spans), unmatched


def _count(v, where: str, col: str):
    if _missing(v):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise AlignBenchFormatError(f"{where}: column '{col}' is {v!r}, expected a vote count") from None
    if f < 0 or f != int(f):
        raise AlignBenchFormatError(f"{where}: column '{col}' is {v!r}, expected a non-negative integer")
    return int(f)


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.\-]+", "_", s.strip()) or "_"


def alignbench_rows(table, source: str = "<table>", image_template: str = "{image_name}",
                    images_dir: str | os.PathLike | None = None, bench_dir: str | os.PathLike = ".",
                    split: str = "test", index_base: int | str = "auto") -> tuple[list[BenchRow], dict]:
    """Convert a DataFrame (or a path read with :func:`read_table`) to BenchRows; returns ``(rows, summary)``.

    The image path is ``image_template`` formatted with the row's columns, under ``images_dir`` when given,
    and stored relative to ``bench_dir`` (the folder of the bench file).
    """
    if not hasattr(table, "columns"):
        source = str(table)
        table = read_table(table)
    missing = [c for c in COLUMNS if c not in table.columns]
    if missing:
        raise AlignBenchFormatError(f"{source}: missing column(s) {', '.join(repr(c) for c in missing)} "
                                    f"(expected columns: {', '.join(COLUMNS)})")
    has_sentence = "sentence" in table.columns
    recs = table.to_dict("records")
    where = [f"{source}: row {i + 1}" for i in range(len(recs))]
    idx: list[int] = []
    for w, r in zip(where, recs):
        v = r["sentence_index"]
        try:
            f = float(v)
            ok = f == int(f)
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise AlignBenchFormatError(f"{w}: column 'sentence_index' is {v!r}, expected an integer")
        idx.append(int(f))
    base = (min(idx) if idx else 0) if index_base == "auto" else int(index_base)
    if base not in (0, 1):
        raise AlignBenchFormatError(f"{source}: column 'sentence_index' starts at {base}, expected 0 or 1")

    def text_of(r, col, w):
        v = r[col]
        if _missing(v):
            raise AlignBenchFormatError(f"{w}: column '{col}' is empty, expected text")
        return str(v).strip()

    # whole captions: (model, image) -> sentences in index order (unless a sentence column exists)
    groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for w, r, i in zip(where, recs, idx):
        sent = text_of(r, "sentence" if has_sentence else "caption", w)
        groups.setdefault((str(r["model"]).strip(), str(r["image_name"]).strip()), []).append((i, sent))
    rows: list[BenchRow] = []
    seen: dict[str, str] = {}
    n_unmatched = 0
    img_root = Path(images_dir) if images_dir is not None else None
    for w, r, i in zip(where, recs, idx):
        model = text_of(r, "model", w)
        image_name = text_of(r, "image_name", w)
        sentence = text_of(r, "sentence" if has_sentence else "caption", w)
        caption = (text_of(r, "caption", w) if has_sentence
                   else " ".join(s for _, s in sorted(groups[(model, image_name)], key=lambda t: t[0])))
        label = map_label(r["annotation"], w)
        spans, unmatched = error_word_spans(sentence, r["error_words"])
        n_unmatched += bool(unmatched)
        try:
            rel = image_template.format(**{k: ("" if _missing(v) else v) for k, v in r.items()})
        except KeyError as e:
            raise AlignBenchFormatError(f"image_template {image_template!r}: no column {e}") from None
        if img_root is not None:
            rel = os.path.relpath(img_root / rel, Path(bench_dir))
        rid = f"{_slug(model)}-{_slug(Path(image_name).stem)}-{i - base}"
        if rid in seen:
            raise AlignBenchFormatError(f"{w}: (model, image_name, sentence_index) = ({model!r}, {image_name!r}, "
                                        f"{i}) repeats {seen[rid]}")
        seen[rid] = w
        extra = {k: _count(r[k], w, k) for k in ("n_correct", "n_incorrect", "n_unknown")}
        extra = {k: v for k, v in extra.items() if v is not None}
        ew = _as_list(r["error_words"])
        extra["error_words"] = ew if ew is not None else ("" if _missing(r["error_words"]) else str(r["error_words"]))
        if unmatched:
            extra["error_words_unmatched"] = unmatched
        extra["annotation"] = str(r["annotation"])
        rows.append(BenchRow(
            id=rid, image=Path(rel).as_posix(), image_id=image_name, generator=model,
            generator_type=generator_type(model), domain="" if _missing(r["image_source"]) else str(r["image_source"]),
            caption_id=f"{_slug(model)}-{_slug(Path(image_name).stem)}", position=i - base, sentence=sentence,
            caption=caption, label=label, types=map_types(r["error_type"]), spans=spans, split=split, extra=extra))
    summary = {"rows": len(rows), "captions": len(groups), "index_base": base,
               "labels": {lab: sum(r.label == lab for r in rows) for lab in ("correct", "incorrect", "unknown")},
               "rows_with_unmatched_error_words": n_unmatched}
    return rows, summary


def convert_alignbench(table, out: str | os.PathLike, image_template: str = "{image_name}",
                       images_dir: str | os.PathLike | None = None, split: str = "test",
                       index_base: int | str = "auto") -> dict:
    """Read an AlignBench table (path or DataFrame) and write ``out`` (bench.jsonl); returns a summary."""
    out = Path(out)
    rows, summary = alignbench_rows(table, image_template=image_template, images_dir=images_dir,
                                    bench_dir=out.parent, split=split, index_base=index_base)
    write_bench(out, rows)
    return summary
