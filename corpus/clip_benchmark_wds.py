"""Export to CLIP_benchmark's WebDataset layout (its ``wds/NAME`` datasets), e.g. a retrieval set for
``clip_benchmark eval --dataset wds/NAME --dataset_root OUT --task zeroshot_retrieval``.

The layout, as CLIP_benchmark 1.6 reads it (``clip_benchmark/datasets/builder.py: build_wds_dataset``) and writes
it (``clip_benchmark/webdataset_builder.py: convert_retrieval_dataset``)::

    OUT/dataset_type.txt          "retrieval" (absent = classification)
    OUT/<split>/nshards.txt       the number of shards N (required)
    OUT/<split>/0.tar ... N-1.tar samples s0000000, s0000001 ... in order:
        <key>.jpg|png|webp        the image (the reader decodes these with PIL and converts to RGB)
        <key>.txt                 retrieval: the image's captions, one per line (read with ``str.splitlines``)
        <key>.cls                 classification: the label (written by callers of :func:`write_wds_split`)

Images reach CLIP_benchmark as the pixels halsift's own evaluation decodes: JPEG, PNG and WebP files whose plain
RGB conversion gives those pixels are copied byte for byte; anything else (another format, an alpha channel, which
halsift composites over white, 16-bit data, an EXIF rotation) is written as a lossless PNG of halsift's decoded
pixels. A caption's line breaks (any character ``str.splitlines`` splits at) become spaces, so each caption stays
one line (CLIP tokenizers collapse whitespace: the tokens are the same). Output is byte-identical on reruns.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from halsift.corpus.atomic import write_text_atomic
from halsift.corpus.errors import InputError

DATASET_TYPE_FILE = "dataset_type.txt"
NSHARDS_FILE = "nshards.txt"
IMAGE_EXTS = ("webp", "png", "jpg", "jpeg")  # what build_wds_dataset decodes, in its order
_LINE_BREAKS = re.compile(r"[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]+")  # where str.splitlines splits
_SAFE_SPLIT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


class ClipBenchmarkExportError(InputError):
    """An export that cannot be written as asked; the message names the folder, file or setting."""


def one_line(caption: str) -> str:
    """``caption`` with each run of line breaks replaced by one space (what CLIP_benchmark reads back as one line)."""
    return _LINE_BREAKS.sub(" ", caption).strip()


def _plain_format(path: Path) -> str | None:
    """``jpg``/``png``/``webp`` when the file's bytes can be copied: a format CLIP_benchmark decodes, whose PIL
    ``convert("RGB")`` equals halsift's decode (no alpha, 8-bit, no EXIF rotation, within halsift's pixel
    limit); else None (and halsift's decoder re-encodes it or names the problem)."""
    import warnings

    from PIL import Image

    from halsift.corpus.images import DEFAULT_MAX_PIXELS

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            with Image.open(path) as img:
                fmt, mode, info, (w, h) = img.format, img.mode, img.info, img.size
                orientation = img.getexif().get(0x0112, 1)
    except Exception:  # noqa: BLE001 - any parser failure: halsift's decoder reports it
        return None
    ext = {"JPEG": "jpg", "PNG": "png", "WEBP": "webp"}.get(fmt or "")
    plain_mode = mode in ("RGB", "L", "CMYK", "YCbCr") or (mode == "P" and "transparency" not in info)
    fits = 0 < w * h <= DEFAULT_MAX_PIXELS
    return ext if ext and plain_mode and fits and orientation in (None, 1) else None


def image_member(path: str | os.PathLike) -> tuple[str, bytes, bool]:
    """``(extension, bytes, re-encoded)`` of an image for a CLIP_benchmark shard (see the module docstring);
    an image halsift cannot decode is a :class:`ClipBenchmarkExportError` naming the file."""
    from halsift.corpus.images import ImageDecodeError, load_image_file

    path = Path(path)
    ext = _plain_format(path)
    if ext:
        return ext, path.read_bytes(), False
    try:
        img = load_image_file(path)
    except ImageDecodeError as e:
        raise ClipBenchmarkExportError(f"{path}: {e.reason}") from None
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return "png", buf.getvalue(), True


def _tar_bytes(members: Iterable[tuple[str, bytes]]) -> bytes:
    """A tar of ``(name, data)`` with fixed metadata (mtime 0, root, 0644): the same bytes on every run."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _chunks(samples: Iterable[dict], n: int) -> Iterator[list[dict]]:
    chunk: list[dict] = []
    for s in samples:
        chunk.append(s)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def check_split_name(split: str) -> str:
    """``split`` if it is a plain folder name (letters, digits, ``_ . -``), else a one-line error."""
    if not _SAFE_SPLIT.match(split or "") or split in (".", ".."):
        raise ClipBenchmarkExportError(f"split: {split!r} is not a plain folder name (letters, digits, _ . -)")
    return split


def write_wds_split(out: str | os.PathLike, split: str, samples: Iterable[dict[str, bytes]], dataset_type: str,
                    maxcount: int = 10_000) -> dict:
    """Write ``samples`` (``{"__key__": key, ext: bytes, ...}`` in order) as ``out/<split>/{0..N-1}.tar`` with
    ``nshards.txt``, and ``out/dataset_type.txt``; returns ``{"samples", "shards"}``.

    The split folder is written under a temporary name and renamed into place when complete; an existing
    non-empty split folder, or a ``dataset_type.txt`` of another type, is an error (other splits may share
    ``out``). ``dataset_type``: ``retrieval``, ``classification`` (written as no file) or ``multilabel``."""
    if maxcount < 1:
        raise ClipBenchmarkExportError(f"maxcount: expected >= 1, got {maxcount}")
    out, split = Path(out), check_split_name(split)
    final, kind = out / split, out / DATASET_TYPE_FILE
    if final.exists() and (not final.is_dir() or any(final.iterdir())):
        raise ClipBenchmarkExportError(f"{final}: already exists; choose another --out or --split")
    if kind.is_file() and kind.read_text(encoding="utf-8").strip().lower() != dataset_type:
        raise ClipBenchmarkExportError(f"{kind}: says {kind.read_text(encoding='utf-8').strip()!r}, not "
                                       f"{dataset_type!r}: {out} holds another kind of dataset")
    tmp = out / f".{split}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    n_samples = n_shards = 0
    try:
        for chunk in _chunks(samples, maxcount):
            members = [(f"{s['__key__']}.{ext}", data) for s in chunk for ext, data in s.items() if ext != "__key__"]
            (tmp / f"{n_shards}.tar").write_bytes(_tar_bytes(members))
            n_samples, n_shards = n_samples + len(chunk), n_shards + 1
        if not n_samples:
            raise ClipBenchmarkExportError(f"{out}: nothing to export (0 samples)")
        (tmp / NSHARDS_FILE).write_text(f"{n_shards}\n", encoding="utf-8")
        if final.is_dir():
            final.rmdir()  # empty (checked above)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if dataset_type != "classification":
        write_text_atomic(kind, f"{dataset_type}\n")
    return {"samples": n_samples, "shards": n_shards}


def export_retrieval(retrieval: str | os.PathLike, out: str | os.PathLike, *, split: str = "test",
                     maxcount: int = 10_000) -> dict:
    """Write a halsift retrieval set (``retrieval.jsonl`` or its folder) as CLIP_benchmark's zero-shot retrieval
    WebDataset at ``out`` (``out/<split>/``); returns a summary with the command that evaluates it."""
    from halsift.corpus.retrieval import read_retrieval

    rs = read_retrieval(retrieval)
    stats = {"captions": 0, "reencoded": 0, "captions_with_line_breaks": 0}

    def samples() -> Iterator[dict]:
        for i, (image, caps) in enumerate(zip(rs.images, rs.captions)):
            ext, data, reencoded = image_member(image)
            lines = [one_line(c) for c in caps]  # read_retrieval: each caption has non-space text
            stats["captions"] += len(lines)
            stats["reencoded"] += int(reencoded)
            stats["captions_with_line_breaks"] += sum(bool(_LINE_BREAKS.search(c)) for c in caps)
            yield {"__key__": f"s{i:07d}", ext: data, "txt": "\n".join(lines).encode("utf-8")}

    written = write_wds_split(out, split, samples(), "retrieval", maxcount)
    return {"images": written["samples"], "shards": written["shards"], "split": split, **stats,
            "clip_benchmark": f"clip_benchmark eval --dataset wds/{Path(out).resolve().name} --dataset_root {out} "
                              f"--split {split} --task zeroshot_retrieval --model MODEL --pretrained TAG"}


__all__ = ["ClipBenchmarkExportError", "check_split_name", "export_retrieval", "image_member", "one_line",
           "write_wds_split"]
