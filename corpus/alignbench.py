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
  "GPT-Gen", named ``sd`` and ``gpt4o-imagen`` in the release) and ``i2t`` for every captioner. Where
  ``image_type`` / ``image_source`` say it outright (``t2i``, ``generated``, ``data_generation`` vs ``i2t``,
  ``coco``, ``cc12m``, ``real``) that wins; disagreements with the model name are counted in the summary.

The HF release (``halcap_bench.jsonl``) adds ``image_type, agreement_ratio, fleiss_Pi, image_url,
image_path_in_repo``: generated images are files under ``images/`` named by ``image_path_in_repo``, COCO /
CC12M images only an ``image_url``. Each row's image is looked up under the image root (``images_dir``, else
the table's folder: the repo checkout) as ``image_path_in_repo``, then ``image_name``,
``<image_source>/<image_name>`` and the ``image_url``'s file name (a local mirror); rows whose image is not
found are left out and counted (``rows_missing_image``, with example URLs), never given a wrong path.

Whether ``caption`` holds the sentence or the whole caption is detected (``caption_column`` in the summary):
when every caption with several annotated sentences repeats one ``caption`` value on all its rows, the column is
the whole caption and the sentence is its ``sentence_index``-th sentence (:func:`sentence_texts`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from pathlib import Path

from halsift.corpus.errors import InputError
from halsift.corpus.bench import TYPES, BenchRow, image_roots, path_inside, write_bench, write_image_roots
from halsift.corpus.sentences import find_word_span, sentence_texts

COLUMNS = ("model", "image_source", "image_name", "sentence_index", "caption", "annotation", "error_type",
           "error_words", "n_correct", "n_incorrect", "n_unknown")
RELEASE_COLUMNS = ("image_type", "agreement_ratio", "fleiss_Pi", "image_url", "image_path_in_repo")
T2I_MODEL_RE = re.compile(r"^sd\b|^sd[-_ ]?3|stable[-_ ]?diffusion|gpt[-_ ]?gen|gpt[-_ ]?image|imagen", re.I)
_T2I_HINT_RE = re.compile(r"^t2i$|text[-_ ]?to[-_ ]?image|data[-_ ]?generation|^generated$|^synthetic$", re.I)
_I2T_HINT_RE = re.compile(r"^i2t$|image[-_ ]?to[-_ ]?text|^coco|^cc12m$|^cc3m$|^real$", re.I)

_LABELS = {
    "correct": "correct", "positive": "correct", "true": "correct", "yes": "correct", "1": "correct",
    "1.0": "correct", "o": "correct", "aligned": "correct",
    "incorrect": "incorrect", "negative": "incorrect", "false": "incorrect", "no": "incorrect", "0": "incorrect",
    "0.0": "incorrect", "x": "incorrect", "hallucination": "incorrect", "hallucinated": "incorrect",
    "wrong": "incorrect",
    "unknown": "unknown", "unk": "unknown", "?": "unknown", "unsure": "unknown", "n/a": "unknown",
}
_TYPES_LOWER = {t.lower(): t for t in TYPES}


class AlignBenchFormatError(InputError):
    """The AlignBench table breaks its format; the message names the file, row and column."""


def generator_type(model: str) -> str:
    """``t2i`` for the text-to-image models (SD 3.5, GPT-Gen / gpt-image-1 / gpt4o-imagen), ``i2t`` otherwise."""
    return "t2i" if T2I_MODEL_RE.search(model.strip()) else "i2t"


def type_hint(*values) -> str | None:
    """``t2i`` / ``i2t`` when an ``image_type`` / ``image_source`` value says so outright, else None."""
    for v in values:
        v = "" if _missing(v) else str(v).strip()
        if _T2I_HINT_RE.search(v):
            return "t2i"
        if _I2T_HINT_RE.search(v):
            return "i2t"
    return None


def whole_caption_column(groups: dict) -> bool:
    """True when ``caption`` holds the whole caption: every caption with 2+ annotated sentences repeats one
    ``caption`` value on all its rows (``groups``: caption -> [(sentence_index, caption cell)]); with one row
    per caption, when 80% of the cells split into several sentences."""
    multi = [g for g in groups.values() if len(g) > 1]
    if multi:
        return all(len({c for _, c in g}) == 1 for g in multi)
    # one annotated sentence per caption: whole captions if most cells hold several sentences
    cells = [c for g in groups.values() for _, c in g]
    return bool(cells) and sum(len(sentence_texts(c)) > 1 for c in cells) >= 0.8 * len(cells)


def _find_image(r: dict, roots: list[Path]) -> Path | None:
    """The row's image under one of ``roots``: image_path_in_repo, image_name, <image_source>/<image_name>, or
    the file name of image_url (a local mirror); None when none exists."""
    from urllib.parse import urlparse

    cands = []
    for col in ("image_path_in_repo", "image_name"):
        if not _missing(r.get(col)):
            cands.append(str(r[col]).strip())
    if not _missing(r.get("image_source")) and not _missing(r.get("image_name")):
        cands.append(f"{str(r['image_source']).strip()}/{str(r['image_name']).strip()}")
    if not _missing(r.get("image_url")):
        cands.append(Path(urlparse(str(r["image_url"]).strip()).path).name)
    for root in roots:
        for c in cands:
            if c and (root / c).is_file():
                return root / c
    return None


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


def _sentence_indices(recs: list[dict], where: list[str], source: str, index_base: int | str) -> tuple[list[int], int]:
    """Each row's ``sentence_index`` as an int, and the base they count from (0 or 1; ``auto``: the smallest)."""
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
    return idx, base


def _text_of(r: dict, col: str, w: str) -> str:
    v = r[col]
    if _missing(v):
        raise AlignBenchFormatError(f"{w}: column '{col}' is empty, expected text")
    return str(v).strip()


def _templated_image(r: dict, w: str, image_template: str, img_root: Path | None,
                     bench_dir: str | os.PathLike) -> str:
    """The row's image path from ``image_template``, relative to the bench folder."""
    try:
        rel = image_template.format(**{k: ("" if _missing(v) else v) for k, v in r.items()})
    except KeyError as e:
        raise AlignBenchFormatError(f"image_template {image_template!r}: no column {e}") from None
    if not rel.strip() or Path(rel) == Path("."):
        raise AlignBenchFormatError(f"{w}: image_template {image_template!r} gives an empty image path")
    return os.path.relpath(img_root / rel, Path(bench_dir)) if img_root is not None else rel


def _row_extra(r: dict, w: str, unmatched: list) -> dict:
    """The annotation columns a BenchRow keeps in ``extra`` (counts, error words, release columns)."""
    extra = {k: _count(r[k], w, k) for k in ("n_correct", "n_incorrect", "n_unknown")}
    extra = {k: v for k, v in extra.items() if v is not None}
    ew = _as_list(r["error_words"])
    extra["error_words"] = ew if ew is not None else ("" if _missing(r["error_words"]) else str(r["error_words"]))
    if unmatched:
        extra["error_words_unmatched"] = unmatched
    extra["annotation"] = str(r["annotation"])
    for k in RELEASE_COLUMNS:
        if k in r and not _missing(r[k]):
            extra[k] = r[k].item() if hasattr(r[k], "item") else r[k]
    return extra


def _generator_type(model: str, r: dict, conflicts: dict[str, int]) -> str:
    """The captioner's type from its name, overridden (and counted in ``conflicts``) by the row's own hint."""
    gtype = generator_type(model)
    hint = type_hint(r.get("image_type"), r.get("image_source"))
    if hint is not None and hint != gtype:
        conflicts[model] = conflicts.get(model, 0) + 1
        gtype = hint
    return gtype


def _raise_no_rows(source: str, roots: list[Path], missing_image: list[str], no_sentence: list[str]) -> None:
    why = missing_image[0] if missing_image else no_sentence[0] if no_sentence else "no rows"
    raise AlignBenchFormatError(f"{source}: no row could be converted (e.g. image not found under "
                                f"{' or '.join(map(str, roots))}: "
                                f"{why})" if missing_image else f"{source}: no row could be converted ({why})")


@dataclasses.dataclass
class _Tally:
    """What a conversion skipped or noticed, for its summary."""

    n_unmatched: int = 0
    missing_image: list[str] = dataclasses.field(default_factory=list)
    no_sentence: list[str] = dataclasses.field(default_factory=list)
    split_mismatch: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    conflicts: dict[str, int] = dataclasses.field(default_factory=dict)
    gen_types: dict[str, set] = dataclasses.field(default_factory=dict)

    def summary(self, rows: list[BenchRow], captions: int, base: int, caption_column: str) -> dict:
        return {"rows": len(rows), "captions": captions, "index_base": base,
                "labels": {lab: sum(r.label == lab for r in rows) for lab in ("correct", "incorrect", "unknown")},
                "rows_with_unmatched_error_words": self.n_unmatched,
                "caption_column": caption_column,
                "generator_types": {m: "/".join(sorted(t)) for m, t in sorted(self.gen_types.items())},
                "generator_type_conflicts": self.conflicts,
                "rows_missing_image": len(self.missing_image), "missing_image_examples": self.missing_image[:10],
                "rows_sentence_not_found": len(self.no_sentence),
                "sentence_not_found_examples": self.no_sentence[:10],
                "captions_split_mismatch": len(self.split_mismatch)}


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
    idx, base = _sentence_indices(recs, where, source, index_base)
    # whole captions: (model, image) -> sentences in index order (unless a sentence column exists)
    groups: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for w, r, i in zip(where, recs, idx):
        sent = _text_of(r, "sentence" if has_sentence else "caption", w)
        groups.setdefault((str(r["model"]).strip(), str(r["image_name"]).strip()), []).append((i, sent))
    whole = not has_sentence and whole_caption_column(groups)
    release = any(c in table.columns for c in ("image_path_in_repo", "image_url"))
    table_dir = Path(source).parent if source != "<table>" else Path(".")
    roots = list(dict.fromkeys([Path(images_dir), table_dir] if images_dir is not None else [table_dir]))
    rows: list[BenchRow] = []
    seen: dict[str, str] = {}
    tally = _Tally()
    missing_image, no_sentence, split_mismatch = tally.missing_image, tally.no_sentence, tally.split_mismatch
    img_root = Path(images_dir) if images_dir is not None else None
    for w, r, i in zip(where, recs, idx):
        model = _text_of(r, "model", w)
        image_name = _text_of(r, "image_name", w)
        if whole:
            caption = _text_of(r, "caption", w)
            sents = sentence_texts(caption)
            if len(sents) != len(groups[(model, image_name)]):
                split_mismatch.add((model, image_name))
            if not 0 <= i - base < len(sents):
                no_sentence.append(f"{w}: sentence_index {i} but the caption splits into {len(sents)} sentences")
                continue
            sentence = sents[i - base]
        else:
            sentence = _text_of(r, "sentence" if has_sentence else "caption", w)
            caption = (_text_of(r, "caption", w) if has_sentence
                       else " ".join(s for _, s in sorted(groups[(model, image_name)], key=lambda t: t[0])))
        if release:
            found = _find_image(r, roots)
            if found is None:
                url = "" if _missing(r.get("image_url")) else str(r["image_url"]).strip()
                missing_image.append(f"{w}: {image_name}" + (f" ({url})" if url else ""))
                continue
            rel = os.path.relpath(found, Path(bench_dir))
        else:
            rel = _templated_image(r, w, image_template, img_root, bench_dir)
        label = map_label(r["annotation"], w)
        spans, unmatched = error_word_spans(sentence, r["error_words"])
        tally.n_unmatched += bool(unmatched)
        rid = f"{_slug(model)}-{_slug(Path(image_name).stem)}-{i - base}"
        if rid in seen:
            raise AlignBenchFormatError(f"{w}: (model, image_name, sentence_index) = ({model!r}, {image_name!r}, "
                                        f"{i}) repeats {seen[rid]}")
        seen[rid] = w
        gtype = _generator_type(model, r, tally.conflicts)
        tally.gen_types.setdefault(model, set()).add(gtype)
        rows.append(BenchRow(
            id=rid, image=Path(rel).as_posix(), image_id=image_name, generator=model,
            generator_type=gtype, domain="" if _missing(r["image_source"]) else str(r["image_source"]),
            caption_id=f"{_slug(model)}-{_slug(Path(image_name).stem)}", position=i - base, sentence=sentence,
            caption=caption, label=label, types=map_types(r["error_type"]), spans=spans, split=split,
            extra=_row_extra(r, w, unmatched)))
    if not rows:
        _raise_no_rows(source, roots, missing_image, no_sentence)
    caption_column = "sentence column" if has_sentence else "whole caption" if whole else "sentence"
    return rows, tally.summary(rows, len(groups), base, caption_column)


def convert_alignbench(table, out: str | os.PathLike, image_template: str = "{image_name}",
                       images_dir: str | os.PathLike | None = None, split: str = "test",
                       index_base: int | str = "auto") -> dict:
    """Read an AlignBench table (path or DataFrame) and write ``out`` (bench.jsonl); returns a summary."""
    out = Path(out)
    rows, summary = alignbench_rows(table, image_template=image_template, images_dir=images_dir,
                                    bench_dir=out.parent, split=split, index_base=index_base)
    write_bench(out, rows)
    # images found under --images or the table's folder, outside the bench's own: their folder is allowed
    own = image_roots(out)[0]
    table_dir = Path(".") if hasattr(table, "columns") else Path(str(table)).parent
    candidates = [Path(os.path.normpath(Path(r).absolute()))
                  for r in ([images_dir] if images_dir else []) + [table_dir]]
    used = set()
    for row in rows:
        path = os.path.normpath(own / row.image)
        root = next((r for r in candidates if path_inside(path, r)), None)  # --images first, then the table's
        if root is not None and not path_inside(path, own):
            used.add(root)
    if used:
        write_image_roots(out, sorted(used))
    return summary
