"""The benchmark format: ``bench.jsonl``, one row per sentence, images beside it (DESIGN.md, "Benchmark").

A row's ``image`` is a path relative to the bench file, and it must stay inside the bench file's folder (checked on
the path's text: no absolute path or ``..`` out of it; symlinks the folder holds are followed) or inside a folder
listed in ``image_roots.json`` beside the bench file (a JSON list of folders, relative ones taken from the bench's
folder). halsift writes that file itself where it points a bench at images elsewhere (``convert alignbench
--images``, a recipe's bench split); a user adds a folder to it to opt in. So a bench file from elsewhere cannot make
``score``, ``train detector`` or an HTML report read (or embed) any other file on the disk.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from halsift.corpus.atomic import atomic_file
from halsift.corpus.errors import InputError
from halsift.corpus.jsonl import iter_jsonl
from halsift.corpus.sentences import words

LABELS = ("correct", "incorrect", "unknown")
TYPES = ("Object", "Attribute", "Number", "Location", "Direction", "Text", "Relation", "Illusion", "Other")
GENERATOR_TYPES = ("i2t", "t2i")
SPLITS = ("train", "val", "test")


IMAGE_ROOTS = "image_roots.json"  # beside a bench file: the folders besides its own that its images may be in


class BenchFormatError(InputError):
    """A benchmark row breaks the schema; the message names file, line and field."""


def path_inside(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """Whether the normalised absolute ``path`` is ``root`` or lies under it (on the text: no symlink is read)."""
    return os.path.commonpath([str(path), str(root)]) == str(root)


def image_roots(bench_path: str | os.PathLike) -> list[Path]:
    """The folders a bench file's images may be in: its own folder and those its ``image_roots.json`` lists
    (absolute, normalised; a malformed file is a :class:`BenchFormatError` naming it)."""
    folder = Path(os.path.normpath(Path(bench_path).absolute().parent))
    roots = [folder]
    listed = folder / IMAGE_ROOTS
    if listed.is_file():
        try:
            extra = json.loads(listed.read_text(encoding="utf-8"))
        except (ValueError, OSError) as e:
            raise BenchFormatError(f"{listed}: not readable JSON ({e})") from None
        if not isinstance(extra, list) or not all(isinstance(r, str) and r for r in extra):
            raise BenchFormatError(f"{listed}: expected a JSON list of folder paths")
        roots += [Path(os.path.normpath(folder / r)) for r in extra]
    return list(dict.fromkeys(roots))


def write_image_roots(bench_path: str | os.PathLike, roots: Iterable[str | os.PathLike]) -> None:
    """Add ``roots`` (folders outside the bench's own) to the ``image_roots.json`` beside ``bench_path``."""
    folder = Path(os.path.normpath(Path(bench_path).absolute().parent))
    have = [str(r) for r in image_roots(bench_path)[1:]]
    new = [str(Path(os.path.normpath(Path(r).absolute()))) for r in roots]
    todo = list(dict.fromkeys(r for r in have + new if r != str(folder)))
    if todo == have:
        return
    with atomic_file(folder / IMAGE_ROOTS) as tmp:
        Path(tmp).write_text(json.dumps(todo, indent=1) + "\n", encoding="utf-8")


def check_image_path(image: str, roots: list[Path], where: str) -> None:
    """Raise :class:`BenchFormatError` unless ``image`` (relative to ``roots[0]``, the bench's folder) lies inside
    one of ``roots`` (see the module docstring)."""
    path = os.path.normpath(os.path.join(roots[0], image))
    if not any(path_inside(path, r) for r in roots):
        raise BenchFormatError(f"{where}: field 'image' {image!r} is outside the bench folder {roots[0]}"
                               + (f" and the folders its {IMAGE_ROOTS} lists" if len(roots) > 1 else "")
                               + f"; move the image under it, or list its folder in {roots[0] / IMAGE_ROOTS}")


@dataclass
class BenchRow:
    """One annotated sentence of one caption of one image."""

    id: str
    image: str  # path relative to the bench file
    image_id: str
    generator: str
    generator_type: str  # i2t | t2i
    domain: str
    caption_id: str
    position: int  # 0-based sentence index within the caption
    sentence: str
    caption: str
    label: str  # correct | incorrect | unknown
    types: list[str] = field(default_factory=list)
    spans: list[list[int]] = field(default_factory=list)  # [start_word, end_word) of hallucinated segments
    split: str = "test"
    extra: dict = field(default_factory=dict)  # optional extra fields (e.g. annotator counts), kept verbatim

    def to_json(self) -> dict:
        """The JSON object of this row: schema fields plus ``extra`` (which cannot override them)."""
        d = asdict(self)
        extra = d.pop("extra")
        return {**extra, **d}


# field -> (python types accepted, description used in errors)
_SCHEMA: dict[str, tuple[tuple[type, ...], str]] = {
    "id": ((str,), "a string"),
    "image": ((str,), "a path string relative to the bench file"),
    "image_id": ((str,), "a string"),
    "generator": ((str,), "a string"),
    "generator_type": ((str,), f"one of {GENERATOR_TYPES}"),
    "domain": ((str,), "a string"),
    "caption_id": ((str,), "a string"),
    "position": ((int,), "a non-negative integer"),
    "sentence": ((str,), "a non-empty string"),
    "caption": ((str,), "a string"),
    "label": ((str,), f"one of {LABELS}"),
    "types": ((list,), f"a list of {TYPES}"),
    "spans": ((list,), "a list of [start_word, end_word) integer pairs"),
    "split": ((str,), f"one of {SPLITS}"),
}
_OPTIONAL = {"types": list, "spans": list, "split": lambda: "test"}


def validate_row(obj: object, where: str) -> BenchRow:
    """Check one decoded JSON object against the schema; ``where`` is ``file:line`` for messages."""
    if not isinstance(obj, dict):
        raise BenchFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    values = {}
    for name, (types, desc) in _SCHEMA.items():
        if name not in obj:
            if name in _OPTIONAL:
                values[name] = _OPTIONAL[name]()
                continue
            raise BenchFormatError(f"{where}: field '{name}' is missing (expected {desc})")
        v = obj[name]
        if isinstance(v, bool) or not isinstance(v, types):
            raise BenchFormatError(f"{where}: field '{name}' is {type(v).__name__} {v!r:.40}, expected {desc}")
        values[name] = v
    if values["position"] < 0:
        raise BenchFormatError(f"{where}: field 'position' is {values['position']}, expected >= 0")
    if values["label"] not in LABELS:
        raise BenchFormatError(f"{where}: field 'label' is {values['label']!r}, expected one of {LABELS}")
    if values["generator_type"] not in GENERATOR_TYPES:
        raise BenchFormatError(
            f"{where}: field 'generator_type' is {values['generator_type']!r}, expected one of {GENERATOR_TYPES}")
    if values["split"] not in SPLITS:
        raise BenchFormatError(f"{where}: field 'split' is {values['split']!r}, expected one of {SPLITS}")
    if not values["sentence"].strip():
        raise BenchFormatError(f"{where}: field 'sentence' is empty")
    bad = [t for t in values["types"] if t not in TYPES]
    if bad:
        raise BenchFormatError(f"{where}: field 'types' has {bad}, expected a subset of {TYPES}")
    n_words = len(words(values["sentence"]))
    for s in values["spans"]:
        if (not isinstance(s, list) or len(s) != 2 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                              for x in s) or not 0 <= s[0] < s[1] <= n_words):
            raise BenchFormatError(f"{where}: field 'spans' has {s!r}, expected [start_word, end_word) with "
                                   f"0 <= start < end <= {n_words} (the sentence's whitespace-split words)")
    extra = {k: v for k, v in obj.items() if k not in _SCHEMA}
    return BenchRow(**values, extra=extra)


def iter_bench(path: str | os.PathLike) -> Iterator[BenchRow]:
    """Stream and validate the rows of a bench file (each image path inside the allowed folders:
    :func:`check_image_path`); errors name file, line and field."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"bench: {path} does not exist")
    seen: set[str] = set()
    roots = image_roots(path)
    for where, _, obj in iter_jsonl(path, BenchFormatError):
        row = validate_row(obj, where)
        check_image_path(row.image, roots, where)
        if row.id in seen:
            raise BenchFormatError(f"{where}: field 'id' {row.id!r} repeats an earlier row")
        seen.add(row.id)
        yield row


def read_bench(path: str | os.PathLike) -> list[BenchRow]:
    """Read and validate a whole bench file (a bench is sentences, small enough to hold). Read and checked once
    per version of the file (and of its ``image_roots.json``) and process, then copied: a recipe plans, scores,
    calibrates and reports from the same bench file dozens of times (0.5 s each for the quickstart's 7,000 rows)."""
    key = _version(path)
    if key is None:
        return list(iter_bench(path))  # missing or unreadable: iter_bench says why
    rows = _READ.get(key)
    if rows is None:
        rows = list(iter_bench(path))
        while len(_READ) >= _READ_MAX:
            _READ.pop(next(iter(_READ)))
        _READ[key] = rows
    return [copy.copy(r) for r in rows]  # each caller's own rows (a caller may set a field)


def _version(path: str | os.PathLike) -> tuple | None:
    """What identifies a bench file's content for :func:`read_bench`: its absolute path, size, mtime and inode, and
    its ``image_roots.json``'s (which changes which image paths are valid)."""
    def stat(p: Path) -> tuple | None:
        try:
            st = p.stat()
        except OSError:
            return None
        return st.st_size, st.st_mtime_ns, st.st_ino

    p = Path(path).absolute()
    own = stat(p)
    return None if own is None else (str(p), own, stat(p.parent / IMAGE_ROOTS))


_READ: dict[tuple, list[BenchRow]] = {}
_READ_MAX = 4  # bench files held at once (the recipe's test split, its calibration rows, ...)


def write_bench(path: str | os.PathLike, rows: Iterable[BenchRow | dict]) -> int:
    """Write rows as JSONL through a temporary file; returns the number of rows written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    seen: set[str] = set()
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            obj = row.to_json() if isinstance(row, BenchRow) else row
            where = f"{path}:{n + 1}"
            checked = validate_row(obj, where)
            if checked.id in seen:
                raise BenchFormatError(f"{where}: field 'id' {checked.id!r} repeats an earlier row")
            seen.add(checked.id)
            f.write(json.dumps(obj, ensure_ascii=False, sort_keys=True) + "\n")
            n += 1
    return n


def image_path(bench_path: str | os.PathLike, row: BenchRow) -> Path:
    """Path of a row's image (``image`` is relative to the bench file; rows from :func:`iter_bench` are checked)."""
    return Path(bench_path).parent / row.image


def with_shuffled_images(rows: Iterable[BenchRow], seed: int = 0) -> list[BenchRow]:
    """The rows with each distinct image replaced by another one of the set (a seeded cyclic derangement): the
    image-shuffle control. A detector that reads the image scores clearly worse on them; a text-only one does not."""
    import dataclasses
    import random

    rows = list(rows)
    images = sorted({r.image for r in rows})
    if len(images) < 2:
        raise ValueError("with_shuffled_images: needs rows with at least two distinct images")
    random.Random(seed).shuffle(images)
    swap = dict(zip(images, images[1:] + images[:1]))
    return [dataclasses.replace(r, image=swap[r.image]) for r in rows]
