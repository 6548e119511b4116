"""Compositional hard-negative sets in SugarCrepe's format (github.com/RAIVNLab/sugar-crepe, ``data/``): one JSON per
category, ``{id: {"filename": ..., "caption": ..., "negative_caption": ...}}``, the category named by the file's stem
(``replace_obj.json``, ``swap_att.json`` ...), and one image folder the filenames are relative to.

``data`` is such a JSON or a folder of them (every ``*.json`` in it, sorted by name). A malformed file, a missing
field or an image that is not in the folder is a :class:`SugarCrepeFormatError` naming the file and the id.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from halsift.corpus.bench import path_inside
from halsift.corpus.errors import InputError

# SugarCrepe's seven categories, in its main_eval.py order
CATEGORIES = ("add_obj", "add_att", "replace_obj", "replace_att", "replace_rel", "swap_obj", "swap_att")
FIELDS = ("filename", "caption", "negative_caption")


class SugarCrepeFormatError(InputError):
    """A SugarCrepe set that cannot be read; the message names the file (and the id)."""


@dataclass(frozen=True)
class Pair:
    """One image with its true caption and its hard negative."""

    id: str
    image: Path
    caption: str
    negative: str


def read_category(path: str | os.PathLike, images: str | os.PathLike) -> list[Pair]:
    """The pairs of one category file; ``images`` is the folder its filenames are relative to."""
    path, images = Path(path), Path(images)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SugarCrepeFormatError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SugarCrepeFormatError(f"{path}: not a JSON file ({e})") from None
    if not isinstance(data, dict):
        raise SugarCrepeFormatError(f"{path}: expected a JSON object {{id: {{{', '.join(FIELDS)}}}}}")
    if not data:
        raise SugarCrepeFormatError(f"{path}: no pairs")
    pairs = []
    for key, item in data.items():
        where = f"{path}: id {key!r}"
        if not isinstance(item, dict):
            raise SugarCrepeFormatError(f"{where}: expected an object with {', '.join(FIELDS)}")
        for f in FIELDS:
            if not isinstance(item.get(f), str) or not item[f].strip():
                raise SugarCrepeFormatError(f"{where}: field {f!r} missing or not a non-empty string")
        image = images / item["filename"]
        root = os.path.normpath(images.absolute())
        if not path_inside(os.path.normpath(image.absolute()), root):  # as bench images outside their folder
            raise SugarCrepeFormatError(f"{where}: field 'filename' {item['filename']!r} is outside the image folder "
                                        f"{images}")
        if not image.is_file():
            raise SugarCrepeFormatError(f"{where}: image {image} is missing")
        pairs.append(Pair(str(key), image, item["caption"], item["negative_caption"]))
    return pairs


def category_files(data: str | os.PathLike) -> dict[str, Path]:
    """Category name (the file's stem) -> its JSON, from one file or a folder of them."""
    data = Path(data)
    if data.is_file():
        return {data.stem: data}
    if not data.is_dir():
        raise SugarCrepeFormatError(f"{data}: missing (expected a SugarCrepe category JSON or a folder of them)")
    files = {p.stem: p for p in sorted(data.glob("*.json"))}
    if not files:
        raise SugarCrepeFormatError(f"{data}: no category JSON files (e.g. {CATEGORIES[0]}.json)")
    return files


def read_sugarcrepe(data: str | os.PathLike, images: str | os.PathLike = "") -> dict[str, list[Pair]]:
    """Every category of ``data`` (a JSON or a folder), images under ``images`` ('' = ``<data folder>/images``)."""
    files = category_files(data)
    root = Path(images) if images else (Path(data) if Path(data).is_dir() else Path(data).parent) / "images"
    if not root.is_dir():
        raise SugarCrepeFormatError(f"{root}: missing (the image folder the filenames are relative to)")
    return {name: read_category(path, root) for name, path in files.items()}


__all__ = ["CATEGORIES", "Pair", "SugarCrepeFormatError", "category_files", "read_category", "read_sugarcrepe"]
