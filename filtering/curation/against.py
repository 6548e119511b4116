"""The image sets ``--against`` reads: each yields ``(id, PIL image)`` with ids as the set names its images.

- a retrieval set (``retrieval.jsonl`` or a folder holding one): id = the row's ``image`` field;
- a bench (``bench.jsonl`` or a folder holding one): id = ``image_id`` (each image once);
- a CLIP_benchmark WebDataset export (a folder with ``dataset_type.txt`` or ``<split>/nshards.txt``): id =
  ``<split>/<sample key>``;
- shards (a folder of ``.tar`` shards, a glob or brace pattern): id = the sample key;
- an image folder (``.jpg/.jpeg/.png/.webp/.bmp/.gif`` files, recursively): id = the path relative to it.
Anything else is :class:`AgainstError` (one line). Images that do not decode are skipped and counted.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from halsift.corpus.errors import InputError
from halsift.corpus.images import ImageDecodeError, SkipCounter, decode_image, load_image_file
from halsift.corpus.shards import ShardFormatError, shard_parts

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif")


class AgainstError(InputError):
    """An ``--against`` path that is not an image set (the message names it and what was expected)."""


def kind_of(path: str | os.PathLike) -> str:
    """``retrieval``, ``bench``, ``wds``, ``shards`` or ``folder``; :class:`AgainstError` otherwise."""
    p = Path(path)
    text = str(path)
    if p.is_file():
        if p.name.endswith(".jsonl"):
            first = _first_line(p)
            return "retrieval" if '"captions"' in first else "bench" if '"image_id"' in first else _bad(path)
        return _bad(path)
    if p.is_dir():
        if (p / "retrieval.jsonl").is_file():
            return "retrieval"
        if (p / "bench.jsonl").is_file():
            return "bench"
        if (p / "dataset_type.txt").is_file() or any(p.glob("*/nshards.txt")):
            return "wds"
        if any(p.glob("*.tar")):
            return "shards"
        if any(f.suffix.lower() in IMAGE_EXTS for f in p.rglob("*") if f.is_file()):
            return "folder"
        return _bad(path)
    if any(ch in text for ch in "*?{"):
        return "shards"
    raise AgainstError(f"--against {path}: does not exist")


def _first_line(p: Path) -> str:
    with open(p, encoding="utf-8", errors="replace") as f:
        return f.readline()


def _bad(path) -> str:
    raise AgainstError(f"--against {path}: not an image set (expected retrieval.jsonl, bench.jsonl, a CLIP_benchmark "
                       "wds folder, shards or an image folder)")


def iter_images(path: str | os.PathLike, skipped: SkipCounter) -> Iterator[tuple[str, object]]:
    """``(id, RGB PIL image)`` of every image of the set at ``path`` (module docstring)."""
    kind = kind_of(path)
    p = Path(path)
    if kind == "retrieval":
        from halsift.corpus.retrieval import read_retrieval

        rs = read_retrieval(p, check_images=False)
        rows = [line for line in open(rs.path, encoding="utf-8") if line.strip()]
        import json

        for full, line in zip(rs.images, rows):
            yield from _load(json.loads(line)["image"], full, skipped)
    elif kind == "bench":
        from halsift.corpus.bench import image_path, iter_bench

        bench = p / "bench.jsonl" if p.is_dir() else p
        seen: set[str] = set()
        for row in iter_bench(bench):
            if row.image_id not in seen:
                seen.add(row.image_id)
                yield from _load(row.image_id, image_path(bench, row), skipped)
    elif kind == "wds":
        for split in sorted(d for d in p.iterdir() if (d / "nshards.txt").is_file()):
            for tar in sorted(split.glob("*.tar"), key=lambda t: (len(t.name), t.name)):
                yield from _wds_tar(split.name, tar, skipped)
    elif kind == "shards":
        from halsift.corpus.sample import read_samples

        for s in read_samples(path, skipped):
            yield s.key, s.image
    else:
        for f in sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in IMAGE_EXTS):
            yield from _load(str(f.relative_to(p)), f, skipped)


def _load(image_id: str, path: Path, skipped: SkipCounter) -> Iterator[tuple[str, object]]:
    try:
        yield image_id, load_image_file(path, image_id)
    except ImageDecodeError as e:
        skipped.add_error(e)


def _wds_tar(split: str, tar: Path, skipped: SkipCounter) -> Iterator[tuple[str, object]]:
    """The images of one CLIP_benchmark shard, read by the shard reader (a damaged shard is counted, after its
    readable samples)."""
    try:
        for key, parts in shard_parts(tar, skipped):
            ext = next((e for e in parts if f".{e}" in IMAGE_EXTS), None)
            if ext is None:
                continue
            try:
                yield f"{split}/{key}", decode_image(parts[ext], f"{split}/{key}")
            except ImageDecodeError as e:
                skipped.add_error(e)
    except ShardFormatError as e:
        skipped.add(str(tar), str(e), "corrupt_shard", n=e.lost or 1)