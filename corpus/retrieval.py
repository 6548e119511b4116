"""Retrieval sets (``retrieval.jsonl`` + images) and converters from COCO / Karpathy / Flickr8k / Flickr30k.

A retrieval set is one JSON object per line, ``{"image": path relative to the file, "captions": [str, ...]}``
(extra fields such as ``split`` or ``image_id`` are kept in the file and ignored by the reader). COCO and
Flickr have 5 captions per image; image->text counts a hit if any of them is retrieved.

The converters write that file next to existing images (paths are made relative to the output file; no
image is copied). Images missing on disk are left out and counted in the returned summary.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from halsift.corpus.atomic import atomic_file
from halsift.corpus.errors import InputError
from halsift.corpus.jsonl import iter_jsonl, read_json


class RetrievalFormatError(InputError):
    """A retrieval or source annotation file breaks its format; the message names file, line and field."""


@dataclass
class RetrievalSet:
    """Images (absolute paths) and their captions, in file order."""

    path: Path
    images: list[Path]
    captions: list[list[str]]

    def __len__(self) -> int:
        return len(self.images)

    def flat_captions(self) -> tuple[list[str], list[int]]:
        """All captions in one list, and for each the index of its image (for text->image queries)."""
        texts, owner = [], []
        for i, caps in enumerate(self.captions):
            texts.extend(caps)
            owner.extend([i] * len(caps))
        return texts, owner


def _check_row(obj: object, where: str) -> tuple[str, list[str]]:
    if not isinstance(obj, dict):
        raise RetrievalFormatError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    if "image" not in obj:
        raise RetrievalFormatError(f"{where}: field 'image' is missing (expected a path relative to the file)")
    image = obj["image"]
    if not isinstance(image, str) or not image.strip():
        raise RetrievalFormatError(f"{where}: field 'image' is {image!r:.40}, expected a non-empty path string")
    if "captions" not in obj:
        raise RetrievalFormatError(f"{where}: field 'captions' is missing (expected a list of strings)")
    caps = obj["captions"]
    if not isinstance(caps, list) or not caps:
        raise RetrievalFormatError(f"{where}: field 'captions' is {caps!r:.40}, expected a non-empty list of "
                                   "strings")
    for j, c in enumerate(caps):
        if not isinstance(c, str) or not c.strip():
            raise RetrievalFormatError(f"{where}: field 'captions[{j}]' is {c!r:.40}, expected a non-empty string")
    return image, caps


def read_retrieval(path: str | os.PathLike, check_images: bool = True) -> RetrievalSet:
    """Read and validate ``retrieval.jsonl``; image paths are resolved against the file's folder.

    Errors (``RetrievalFormatError``) name ``file:line`` and the field: invalid JSON, missing/ill-typed
    ``image`` or ``captions``, a repeated image, or (with ``check_images``) an image that does not exist.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "retrieval.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"retrieval set: {path} does not exist")
    images: list[Path] = []
    captions: list[list[str]] = []
    seen: dict[str, int] = {}
    for where, lineno, obj in iter_jsonl(path, RetrievalFormatError):
        image, caps = _check_row(obj, where)
        if image in seen:
            raise RetrievalFormatError(f"{where}: field 'image' {image!r} repeats line {seen[image]}")
        seen[image] = lineno
        full = (path.parent / image).resolve()
        if check_images and not full.is_file():
            raise RetrievalFormatError(f"{where}: field 'image' {image!r}: no such file {full}")
        images.append(full)
        captions.append(list(caps))
    if not images:
        raise RetrievalFormatError(f"{path}: holds no rows")
    return RetrievalSet(path=path, images=images, captions=captions)


def write_retrieval(path: str | os.PathLike, rows: Iterable[dict]) -> int:
    """Write rows ``{"image", "captions", ...}`` as JSONL through a temporary file; returns the row count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in rows:
            _check_row(row, f"{path}:{n + 1}")
            f.write(json.dumps(row, ensure_ascii=False, sort_keys=True) + "\n")
            n += 1
    return n


def _load_json(path: str | os.PathLike, what: str) -> dict:
    return read_json(path, RetrievalFormatError, what)


def _field(obj: dict, name: str, where: str, types: type | tuple) -> object:
    if name not in obj:
        raise RetrievalFormatError(f"{where}: field '{name}' is missing")
    v = obj[name]
    if not isinstance(v, types):
        raise RetrievalFormatError(f"{where}: field '{name}' is {type(v).__name__}, expected "
                                   f"{getattr(types, '__name__', types)}")
    return v


def _emit(out: str | os.PathLike, items: Iterable[tuple[Path, list[str], dict]],
          max_captions: int | None) -> dict:
    """Write (image path, captions, extra) items whose image exists; return a summary."""
    out = Path(out)
    rows, missing, n_caps = [], [], 0
    for image, caps, extra in items:
        caps = [c.strip() for c in caps if c and c.strip()][:max_captions]
        if not caps:
            continue
        if not image.is_file():
            missing.append(str(image))
            continue
        rel = os.path.relpath(image.resolve(), out.parent.resolve())
        rows.append({"image": Path(rel).as_posix(), "captions": caps, **extra})
        n_caps += len(caps)
    if not rows:
        raise RetrievalFormatError(f"{out}: nothing to write (0 images with captions found on disk"
                                   + (f"; e.g. missing {missing[0]}" if missing else "") + ")")
    write_retrieval(out, rows)
    return {"images": len(rows), "captions": n_caps, "missing_images": len(missing),
            "missing_examples": missing[:10]}


def _splits(split: str | Iterable[str] | None) -> set[str] | None:
    if split is None:
        return None
    return {s.strip() for s in (split.split(",") if isinstance(split, str) else split) if s.strip()}


def from_coco(captions_json: str | os.PathLike | None, images_dir: str | os.PathLike, out: str | os.PathLike,
              split: str | Iterable[str] | None = None, karpathy_json: str | os.PathLike | None = None,
              max_captions: int | None = None) -> dict:
    """Convert COCO captions to a retrieval set at ``out``; returns ``{"images", "captions", "missing_images"}``.

    Without ``karpathy_json``: ``captions_json`` is a COCO ``captions_*.json`` (``images[].id/file_name``,
    ``annotations[].image_id/caption``); images are ``images_dir/file_name``. With ``karpathy_json``
    (``dataset_coco.json``: ``images[].split/filepath/filename/sentences[].raw``), captions and the split
    come from it and images are ``images_dir/filepath/filename``; ``split`` keeps only those splits (e.g.
    ``"test"``, or ``"train,restval"``; exact names, Karpathy has train/restval/val/test).
    """
    images_dir = Path(images_dir)
    wanted = _splits(split)
    if karpathy_json is not None:
        kp = Path(karpathy_json)
        data = _load_json(kp, "Karpathy split file")
        entries = _field(data, "images", str(kp), list)

        def items():
            for i, im in enumerate(entries):
                where = f"{kp}: images[{i}]"
                if not isinstance(im, dict):
                    raise RetrievalFormatError(f"{where}: expected an object")
                sp = str(_field(im, "split", where, str))
                if wanted is not None and sp not in wanted:
                    continue
                filename = _field(im, "filename", where, str)
                sub = im.get("filepath", "") or ""
                sents = _field(im, "sentences", where, list)
                caps = []
                for j, s in enumerate(sents):
                    if not isinstance(s, dict) or not isinstance(s.get("raw"), str):
                        raise RetrievalFormatError(f"{where}.sentences[{j}]: field 'raw' is missing or not a string")
                    caps.append(s["raw"])
                extra = {"split": sp}
                for k in ("cocoid", "imgid"):
                    if k in im:
                        extra["image_id"] = str(im[k])
                        break
                yield images_dir / sub / filename, caps, extra

        return _emit(out, items(), max_captions)
    if captions_json is None:
        raise ValueError("from_coco: give captions_json, karpathy_json, or both")
    if wanted is not None:
        raise ValueError("from_coco: split needs karpathy_json (COCO captions files carry no split)")
    cj = Path(captions_json)
    data = _load_json(cj, "COCO captions file")
    ims = _field(data, "images", str(cj), list)
    anns = _field(data, "annotations", str(cj), list)
    by_id: dict[object, list[str]] = {}
    for i, a in enumerate(anns):
        where = f"{cj}: annotations[{i}]"
        if not isinstance(a, dict):
            raise RetrievalFormatError(f"{where}: expected an object")
        by_id.setdefault(_field(a, "image_id", where, (int, str)), []).append(
            _field(a, "caption", where, str))

    def coco_items():
        for i, im in enumerate(ims):
            where = f"{cj}: images[{i}]"
            if not isinstance(im, dict):
                raise RetrievalFormatError(f"{where}: expected an object")
            iid = _field(im, "id", where, (int, str))
            yield images_dir / _field(im, "file_name", where, str), by_id.get(iid, []), {"image_id": str(iid)}

    return _emit(out, coco_items(), max_captions)


_TOKEN_RE = re.compile(r"^(?P<image>[^#\t]+)#(?P<idx>\d+)\t(?P<caption>.*)$")


def _read_flickr_captions(token_file: Path) -> dict[str, list[tuple[int, str]]]:
    """image name -> [(caption index, caption)] from any of the Flickr caption file layouts."""
    caps: dict[str, list[tuple[int, str]]] = {}
    with open(token_file, encoding="utf-8", newline="") as f:
        first = f.readline()
        header = first.strip().lower().replace(" ", "")
        if header.startswith("image_name|"):  # Flickr30k results.csv: image_name| comment_number| comment
            for lineno, line in enumerate(f, 2):
                if not line.strip():
                    continue
                parts = [p.strip() for p in line.rstrip("\r\n").split("|", 2)]
                if len(parts) != 3 or not parts[1].isdigit():
                    raise RetrievalFormatError(f"{token_file}:{lineno}: expected 'image_name| comment_number| "
                                               f"comment', got {line.strip()!r:.60}")
                caps.setdefault(parts[0], []).append((int(parts[1]), parts[2]))
        elif header == "image,caption":  # Flickr8k captions.txt (Kaggle layout)
            for lineno, row in enumerate(csv.reader(f), 2):
                if not row:
                    continue
                if len(row) < 2:
                    raise RetrievalFormatError(f"{token_file}:{lineno}: expected 'image,caption'")
                lst = caps.setdefault(row[0].strip(), [])
                lst.append((len(lst), ",".join(row[1:]).strip()))
        else:  # Flickr8k.token.txt / results_20130124.token: image.jpg#N<TAB>caption
            f.seek(0)
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                m = _TOKEN_RE.match(line.rstrip("\r\n"))
                if not m:
                    raise RetrievalFormatError(f"{token_file}:{lineno}: expected 'image.jpg#N<TAB>caption', got "
                                               f"{line.strip()!r:.60}")
                caps.setdefault(m["image"].strip(), []).append((int(m["idx"]), m["caption"]))
    return caps


def from_flickr(token_file: str | os.PathLike, images_dir: str | os.PathLike, out: str | os.PathLike,
                split_file: str | os.PathLike | None = None, max_captions: int | None = None) -> dict:
    """Convert Flickr8k/Flickr30k captions to a retrieval set at ``out``; returns a summary like :func:`from_coco`.

    ``token_file`` is ``Flickr8k.token.txt`` / ``results_20130124.token`` (``img.jpg#N<TAB>caption``),
    Flickr30k's ``results.csv`` (``image_name| comment_number| comment``) or the ``image,caption`` CSV.
    Captions are ordered by their number. ``split_file`` (e.g. ``Flickr_8k.testImages.txt``: one image name
    per line) keeps only those images, in the token file's order.
    """
    token_file = Path(token_file)
    if not token_file.exists():
        raise FileNotFoundError(f"Flickr token file: {token_file} does not exist")
    caps = _read_flickr_captions(token_file)
    keep: set[str] | None = None
    if split_file is not None:
        sp = Path(split_file)
        if not sp.exists():
            raise FileNotFoundError(f"Flickr split file: {sp} does not exist")
        keep = {ln.strip() for ln in sp.read_text(encoding="utf-8").splitlines() if ln.strip()}
    images_dir = Path(images_dir)
    items = ((images_dir / name, [c for _, c in sorted(lst, key=lambda t: t[0])], {})
             for name, lst in caps.items() if keep is None or name in keep)
    return _emit(out, items, max_captions)
