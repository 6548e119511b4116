"""Converters from the layouts users already have into corpus shards (DESIGN.md, "Corpus shards").

* :func:`table_to_shards`: a parquet / JSONL / CSV table with an image column (a path, raw bytes, or the
  Hugging Face ``Image`` struct ``{bytes, path}``) and a caption column; parquet is streamed by record batch.
* :func:`hf_to_shards`: a Hugging Face ``datasets`` folder written by ``save_to_disk`` (its Arrow stream files,
  read with pyarrow, so the ``datasets`` package is not needed), one split or a ``DatasetDict`` (all splits, or
  those named); each sample's json records its ``split``.
* :func:`folder_to_shards`: an image folder with sidecar captions (``<name>.txt``, optional ``<name>.json``).
* :func:`webdataset_to_shards`: any WebDataset shards webdataset can open: local tars, brace patterns,
  ``pipe:`` commands and fsspec/``s3://`` URLs (through ``webdataset.gopen``) -- img2dataset output included.

Samples whose json lacks ``captioner`` / ``source`` get the given defaults (counted in the summary). A sample
that cannot be written (no caption, no image, unreadable image file, a caption that is not valid UTF-8:
``bad_caption``) is skipped and counted, never fatal; an input with no usable sample at all is an error naming the
column or field. WebDataset input follows the shard readers' key rule (:class:`~halsift.corpus.shards.SampleGroups`:
a key repeated within one input shard is skipped and counted as ``duplicate``); keys that collide otherwise (a
table's repeated key column, a key in two input shards, two names that sanitize alike) are made unique with a
``_N`` suffix and counted in ``renamed_keys``.
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

from halsift.corpus.errors import InputError
from halsift.corpus.shards import (BAD_CAPTION, IMAGE_EXTS, META_DEFAULTS, Sample, SampleGroups, ShardFormatError,
                                   ShardWriter, bad_caption_reason, caption_text)

TABLE_SUFFIXES = (".parquet", ".jsonl", ".ndjson", ".csv", ".tsv")
_BAD_KEY_CHARS = re.compile(r"[^A-Za-z0-9_\-]+")


class ConvertError(InputError):
    """An input that cannot be converted; the message names the file, column or field."""


def _ext_of(name: str, data: bytes) -> str:
    """Image extension from a file name, else from the bytes' magic number (jpg when unknown)."""
    ext = Path(name).suffix.lower().lstrip(".") if name else ""
    if ext in IMAGE_EXTS:
        return "jpg" if ext == "jpeg" else ext
    if data.startswith(b"\x89PNG"):
        return "png"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return "jpg"


class _Writer:
    """A :class:`ShardWriter` that fills metadata defaults, makes keys valid and unique, and counts skips."""

    def __init__(self, out: str | os.PathLike, maxcount: int, defaults: dict[str, str]) -> None:
        out = Path(out)
        if out.exists() and any(out.glob("*.tar")):
            raise ConvertError(f"out: {out} already holds shards; choose a new folder")
        self.w = ShardWriter(out, maxcount=maxcount)
        self.defaults = defaults
        self.defaulted: Counter = Counter()
        self.skipped: Counter = Counter()
        self.examples: list[str] = []
        self.keys: set[str] = set()
        self.renamed: list[str] = []

    def skip(self, key: str, kind: str, why: str) -> None:
        self.skipped[kind] += 1
        if len(self.examples) < 10:
            self.examples.append(f"{key}: {why}")

    def add(self, key: str, reason: str, kind: str | None = None, n: int = 1) -> None:
        """:meth:`skip` in :class:`~halsift.corpus.images.SkipCounter`'s signature (for the shard readers)."""
        for _ in range(n):
            self.skip(key, kind or reason, reason)

    def write(self, key: str, image: bytes, caption: str, meta: dict, ext: str) -> None:
        key = _BAD_KEY_CHARS.sub("_", str(key)).strip("_") or "sample"
        base, n = key, 1
        while key in self.keys:
            key, n = f"{base}_{n}", n + 1
        if n > 1:
            self.renamed.append(f"{base} -> {key}")
        if not caption.strip():
            return self.skip(key, "empty_caption", "no caption")
        if not image:
            return self.skip(key, "missing_image", "no image")
        missing = {k: v for k, v in self.defaults.items() if not meta.get(k)}
        self.defaulted.update(missing.keys())
        meta = {**meta, **missing}
        meta.pop("key", None)
        try:
            self.w.write(Sample(key, image, caption, meta, ext))
        except ShardFormatError as e:
            return self.skip(key, "bad_meta", str(e))
        self.keys.add(key)

    def close(self, what: str) -> dict:
        """The summary, once the shard writer is closed; raises when not one sample was written."""
        if not self.w.total:
            why = f"; e.g. {self.examples[0]}" if self.examples else ""
            raise ConvertError(f"{what}: no sample could be converted ({dict(self.skipped)}{why})")
        return {"samples": self.w.total, "shards": len(self.w.sizes), "skipped": dict(sorted(self.skipped.items())),
                "skipped_examples": self.examples, "defaults": self.defaults,
                "defaulted": dict(sorted(self.defaulted.items())), "renamed_keys": len(self.renamed),
                "renamed_examples": self.renamed[:10]}


def _defaults(captioner: str | None, source: str | None) -> dict[str, str]:
    d = dict(META_DEFAULTS)
    if captioner:
        d["captioner"] = captioner
    if source:
        d["source"] = source
    return d


def _jsonable(v):
    if isinstance(v, bytes):
        return None
    if hasattr(v, "isoformat"):
        return v.isoformat()
    return v


def _table_batches(path: Path, batch_rows: int = 1024) -> Iterator[list[dict]]:
    """Rows of a parquet / JSONL / CSV table, a batch at a time (parquet streamed, the others read whole)."""
    import pyarrow as pa

    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as e:
            raise ConvertError(f"{path}: not a readable parquet file ({e})") from e
        for b in pf.iter_batches(batch_size=batch_rows):
            yield b.to_pylist()
        return
    try:
        if suffix in (".jsonl", ".ndjson"):
            import pyarrow.json as pj

            t = pj.read_json(path)
        elif suffix in (".csv", ".tsv"):
            import pyarrow.csv as pcsv

            t = pcsv.read_csv(path, parse_options=pcsv.ParseOptions(delimiter="\t" if suffix == ".tsv" else ","))
        else:
            raise ConvertError(f"{path}: unknown table format {suffix!r}, expected one of {TABLE_SUFFIXES}")
    except pa.ArrowException as e:
        raise ConvertError(f"{path}: not a readable {suffix[1:]} table ({e})") from e
    for b in t.to_batches(max_chunksize=batch_rows):
        yield b.to_pylist()


class _Rows(NamedTuple):
    """A batch of table rows; ``meta`` is added to each sample's json (the row's own columns win), and default
    keys are ``key_prefix`` + the row's number among the rows with that prefix."""

    rows: list[dict]
    meta: dict = {}
    key_prefix: str = ""


def _rows_to_shards(batches: Iterable[_Rows], what: str, w: _Writer,
                    image_col: str, caption_col: str, key_col: str | None, image_root: Path) -> None:
    first = True
    numbers: Counter = Counter()
    for rows, extra, prefix in batches:
        for r in rows:
            if first:
                for col in [image_col, caption_col] + ([key_col] if key_col else []):
                    if col not in r:
                        raise ConvertError(f"{what}: no column {col!r} (columns: {', '.join(map(str, r))}); "
                                           "name it with --image-col / --caption-col / --key-col")
                first = False
            key = str(r[key_col]) if key_col else f"{prefix}{numbers[prefix]:09d}"
            numbers[prefix] += 1
            img, name = r[image_col], ""
            if isinstance(img, dict):  # the Hugging Face Image feature: {"bytes": ..., "path": ...}
                img, name = img.get("bytes") or img.get("path"), img.get("path") or ""
            if isinstance(img, str):
                name = img
                p = Path(img) if Path(img).is_absolute() else image_root / img
                try:
                    img = p.read_bytes()
                except OSError as e:
                    w.skip(key, "missing_image", f"image {p}: {e.strerror or e}")
                    continue
            if not isinstance(img, (bytes, bytearray)):
                w.skip(key, "missing_image", f"column {image_col!r} is {type(img).__name__}")
                continue
            cap = r[caption_col]
            cap = " ".join(map(str, cap)) if isinstance(cap, list) else ("" if cap is None else str(cap))
            meta = {**extra, **{k: _jsonable(v) for k, v in r.items() if k not in (image_col, caption_col)
                                and not isinstance(v, (bytes, dict))}}
            w.write(key, bytes(img), cap, meta, _ext_of(name, bytes(img)))
    if first:
        raise ConvertError(f"{what}: the table has no rows")


def table_to_shards(table: str | os.PathLike, out: str | os.PathLike, *, image_col: str = "image",
                    caption_col: str = "caption", key_col: str | None = None,
                    image_root: str | os.PathLike | None = None, captioner: str | None = None,
                    source: str | None = None, maxcount: int = 1000) -> dict:
    """Convert a parquet / JSONL / CSV table of (image, caption) rows into shards at ``out``; returns a summary.

    Image paths are relative to ``image_root`` (default: the table's folder). Other scalar columns go to the
    sample json.
    """
    path = Path(table)
    if not path.is_file():
        raise FileNotFoundError(f"table: {path} does not exist")
    w = _Writer(out, maxcount, _defaults(captioner, source))
    with w.w:
        _rows_to_shards((_Rows(b) for b in _table_batches(path)), str(path), w, image_col, caption_col, key_col,
                        Path(image_root) if image_root else path.parent)
    return w.close(str(path))


def _json_object(path: Path, what: str) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConvertError(f"{path}: not a valid {what} ({e})") from None
    if not isinstance(obj, dict):
        raise ConvertError(f"{path}: not a valid {what} (expected a JSON object)")
    return obj


def _hf_dataset(folder: Path) -> tuple[str | None, list[Path]]:
    """A ``Dataset.save_to_disk`` folder: its split as ``state.json`` records it (``None`` if not) and Arrow files."""
    state = folder / "state.json"
    if not state.is_file():
        raise ConvertError(f"{folder}: not a Hugging Face save_to_disk folder (no state.json or dataset_dict.json)")
    obj = _json_object(state, "Hugging Face state.json")
    split = obj.get("_split")
    return (str(split) if split else None), [folder / f["filename"] for f in obj.get("_data_files", [])]


def hf_splits(folder: str | os.PathLike, wanted: str | Iterable[str] | None = None
              ) -> list[tuple[str | None, list[Path], bool]]:
    """``(split, arrow files, from a DatasetDict)`` of a ``save_to_disk`` folder: every split of a DatasetDict
    (``dataset_dict.json``) or the one Dataset. ``wanted`` (names, or one comma-separated string) keeps only those
    splits; a name the folder does not hold is an error listing the splits it does."""
    folder = Path(folder)
    names = None if wanted is None else [s.strip() for s in (wanted.split(",") if isinstance(wanted, str)
                                                                else wanted) if s.strip()]
    if (folder / "dataset_dict.json").is_file():
        splits = [str(s) for s in _json_object(folder / "dataset_dict.json", "Hugging Face dataset_dict.json")
                  .get("splits", [])]
        bad = [s for s in splits if s in ("", ".", "..") or "/" in s or "\\" in s]
        if bad:
            raise ConvertError(f"{folder / 'dataset_dict.json'}: split {bad[0]!r} is not a folder name")
        found = [(s, _hf_dataset(folder / s)[1], True) for s in splits]
    else:
        split, files = _hf_dataset(folder)
        found = [(split, files, False)]
    if names:
        have = [s for s, _, _ in found if s is not None]
        unknown = [n for n in names if n not in have]
        if unknown:
            held = f"splits: {', '.join(have)}" if have else "a single Dataset with no recorded split; omit --split"
            raise ConvertError(f"{folder}: no split {unknown[0]!r} ({held})")
        found = [x for x in found if x[0] in names]
    return found


def hf_to_shards(folder: str | os.PathLike, out: str | os.PathLike, *, image_col: str = "image",
                 caption_col: str = "caption", key_col: str | None = None, captioner: str | None = None,
                 source: str | None = None, maxcount: int = 1000, split: str | Iterable[str] | None = None) -> dict:
    """Convert a Hugging Face ``datasets`` folder (``Dataset.save_to_disk``, or a ``DatasetDict``'s: all splits,
    or those in ``split``) into shards; returns a summary (with the ``splits`` converted).

    Each sample's json records its ``split`` (a DatasetDict's split name, or the one a single Dataset's
    ``state.json`` records; a ``split`` column of the rows is kept as it is). Default keys of a DatasetDict are
    ``<split>-<row number in the split>``, so they do not depend on which splits are converted."""
    import pyarrow as pa

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"HF dataset: {folder} is not a folder")
    splits = hf_splits(folder, split)

    def batches():
        for name, files, in_dict in splits:
            meta, prefix = ({"split": name} if name else {}), (f"{name}-" if in_dict else "")
            for f in files:
                try:
                    with pa.OSFile(str(f)) as src:
                        for b in pa.ipc.open_stream(src):
                            yield _Rows(b.to_pylist(), meta, prefix)
                except (pa.ArrowException, OSError) as e:
                    raise ConvertError(f"{f}: not a readable Arrow stream ({e})") from e

    w = _Writer(out, maxcount, _defaults(captioner, source))
    with w.w:
        _rows_to_shards(batches(), str(folder), w, image_col, caption_col, key_col, folder)
    return {**w.close(str(folder)), "splits": [s for s, _, _ in splits if s is not None]}


def folder_to_shards(folder: str | os.PathLike, out: str | os.PathLike, *, captioner: str | None = None,
                     source: str | None = None, maxcount: int = 1000) -> dict:
    """Convert an image folder (recursively) with sidecar ``<name>.txt`` captions (and optional ``<name>.json``
    metadata) into shards; images without a caption file are skipped and counted. Returns a summary."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder: {folder} is not a folder")
    images = sorted(p for p in folder.rglob("*") if p.suffix.lower().lstrip(".") in IMAGE_EXTS and p.is_file())
    if not images:
        raise ConvertError(f"{folder}: no image files ({', '.join(IMAGE_EXTS)})")
    w = _Writer(out, maxcount, _defaults(captioner, source))
    with w.w:
        for p in images:
            key = p.relative_to(folder).with_suffix("").as_posix()
            txt, js = p.with_suffix(".txt"), p.with_suffix(".json")
            if not txt.is_file():
                w.skip(key, "empty_caption", f"no caption file {txt.name}")
                continue
            meta = {}
            if js.is_file():
                try:
                    meta = json.loads(js.read_text(encoding="utf-8"))
                except (json.JSONDecodeError, UnicodeDecodeError):
                    w.skip(key, "bad_meta", f"{js.name} is not valid JSON")
                    continue
                meta = meta if isinstance(meta, dict) else {}
            meta.setdefault("image_path", p.relative_to(folder).as_posix())
            raw = txt.read_bytes()
            caption = caption_text(raw)
            if caption is None:
                w.skip(key, BAD_CAPTION, f"{txt.name}: {bad_caption_reason(raw)}")
                continue
            w.write(key, p.read_bytes(), caption.strip(), meta, _ext_of(p.name, b""))
    return w.close(str(folder))


def _open_stream(url: str):
    """A readable byte stream: ``pipe:`` / local / http through ``webdataset.gopen``, other ``scheme://`` URLs
    (``s3://``, ``gs://`` ...) through fsspec with the user's backend."""
    import webdataset as wds

    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme and scheme not in ("http", "https", "file"):
        import fsspec

        return fsspec.open(url, "rb").open()
    return wds.gopen(url, "rb")


def webdataset_to_shards(urls: str | list[str], out: str | os.PathLike, *, captioner: str | None = None,
                         source: str | None = None, maxcount: int = 1000) -> dict:
    """Copy WebDataset shards -- local paths, brace patterns, ``pipe:CMD`` or fsspec URLs such as ``s3://``
    (``s3://`` needs the user's fsspec backend, e.g. s3fs) -- into local shards in our layout (json defaults
    filled, ``sizes.json`` written): img2dataset output, remote corpora. A local folder means its ``*.tar``.
    Returns a summary."""
    import tarfile

    import braceexpand
    from webdataset.tariterators import tar_file_expander

    from halsift.corpus.shards import expand_shards

    what = urls if isinstance(urls, str) else " ".join(urls)
    if isinstance(urls, str) and Path(urls).is_dir():
        urls = [str(p) for p in expand_shards(urls)]
    url_list = [u for x in ([urls] if isinstance(urls, str) else urls) for u in braceexpand.braceexpand(x)]
    w = _Writer(out, maxcount, _defaults(captioner, source))

    def samples(u: str):  # one input shard's samples, by the shard readers' key rule (duplicates counted in w)
        members = tar_file_expander([{"url": u, "stream": _open_stream(u)}])
        yield from SampleGroups(u.rsplit("/", 1)[-1] or u, w)((m["fname"], lambda d=m["data"]: d) for m in members)

    try:
        with w.w:
            for key, s in (kv for u in url_list for kv in samples(u)):
                ext = next((e for e in IMAGE_EXTS if e in s), "")
                meta = {}
                if "json" in s:
                    try:
                        meta = json.loads(s["json"])
                    except (json.JSONDecodeError, UnicodeDecodeError):
                        w.skip(key, "bad_meta", "json member is not valid JSON")
                        continue
                    meta = meta if isinstance(meta, dict) else {}
                cap = caption_text(s.get("txt", b""))
                if cap is None:
                    w.skip(key, BAD_CAPTION, bad_caption_reason(s["txt"]))
                    continue
                cap = cap or str(meta.get("caption") or "")
                w.write(key, s.get(ext, b""), cap, meta, "jpg" if ext == "jpeg" else ext or "jpg")
    except (OSError, ValueError, ImportError, tarfile.TarError) as e:
        # a failed pipe command, a missing file or fsspec backend, a bad URL, a stream that is not a tar
        msg = (f"{e.strerror}: {e.filename}" if isinstance(e, OSError) and e.strerror
               else str(e.args[0]).splitlines()[0] if e.args else type(e).__name__)
        raise ConvertError(f"{what}: cannot read these shards ({msg})") from e
    return w.close(what)
