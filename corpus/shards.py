"""WebDataset shards in the img2dataset / open_clip layout (DESIGN.md, "Corpus shards").

A shard folder holds ``NNNNNN.tar`` files, each with ``<key>.jpg|png|webp``, ``<key>.txt`` (the whole
caption) and ``<key>.json`` (at least ``key``, ``captioner``, ``source``), a ``NNNNNN_stats.json`` per shard
and ``sizes.json`` (shard basename -> sample count) so ``open_clip_train`` needs no ``--train-num-samples``.

Writing and reading stream: nothing here holds more than one sample in memory. Tars are written with the
stdlib ``tarfile`` (the format webdataset reads; its own ``ShardWriter`` has no atomic rename or stats).
"""

from __future__ import annotations

import functools
import glob
import io
import json
import os
import re
import tarfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from halsift.corpus.errors import InputError
from halsift.corpus.atomic import atomic_file, naming_errors
from halsift.corpus.tar_members import open_members

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")
REQUIRED_META = ("key", "captioner", "source")
SOURCES = ("i2t", "t2i")
# What a sample whose json lacks these fields (img2dataset output: url, key, status, caption) is given when it
# is written again (select); callers may override them (``select --captioner/--source``).
META_DEFAULTS = {"captioner": "unknown", "source": "i2t"}
_KEY_RE = re.compile(r"^[A-Za-z0-9_\-]+$")
_URL_RE = re.compile(r"^(pipe:|[A-Za-z][A-Za-z0-9+.\-]*://)")
# inputs that are not shards; `halsift convert` turns them into shards
_NOT_SHARD_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv", ".tsv", ".arrow", ".txt",
                       *(f".{e}" for e in IMAGE_EXTS))
_CONVERT_HINT = ("tables, image folders, HF datasets and remote or piped shards are converted first: "
                 "`halsift convert table|folder|hf|webdataset SRC --out DIR`")


class ShardFormatError(InputError):
    """A shard or shard folder does not follow the contract; the message names the file and member.

    For a damaged shard, ``lost`` is how many of its samples could not be read (from ``sizes.json`` or the
    shard's ``_stats.json``; None when neither records a count)."""

    def __init__(self, message: str, lost: int | None = None) -> None:
        super().__init__(message)
        self.lost = lost


@dataclass
class Sample:
    """One image–caption pair as stored in a shard."""

    key: str
    image: bytes
    caption: str
    meta: dict = field(default_factory=dict)
    ext: str = "jpg"
    shard: str = ""  # basename of the shard it was read from ("" when not read from a shard)

    @property
    def captioner(self) -> str:
        return str(self.meta.get("captioner", ""))

    @property
    def source(self) -> str:
        return str(self.meta.get("source", ""))


def write_json_atomic(path: str | os.PathLike, obj, indent: int | None = 2) -> None:
    """Write JSON to ``path`` through a temporary name, so a reader never sees half a file."""
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def _add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0  # fixed, so the same samples give byte-identical shards
    info.mode = 0o644
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


class ShardWriter:
    """Write samples into ``out_dir/NNNNNN.tar`` shards of at most ``maxcount`` samples each.

    Each shard is written to a temporary name and renamed when closed; ``sizes.json`` is merged with what the
    folder already holds, so several writers (ranks) may fill one folder with disjoint ``start_index`` ranges.
    """

    def __init__(self, out_dir: str | os.PathLike, maxcount: int = 1000, start_index: int = 0) -> None:
        if maxcount < 1:
            raise ValueError(f"maxcount must be >= 1, got {maxcount}")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.maxcount = maxcount
        self.index = start_index
        self.sizes: dict[str, int] = {}
        self._tar: tarfile.TarFile | None = None
        self._tmp: Path | None = None
        self._count = 0
        self._stats: Counter = Counter()
        self._keys: set[str] = set()
        self.total = 0

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            # An interrupted writer must not leave a short shard that looks finished: drop the open one,
            # keep (and record) the shards that were completed.
            self.abort()
        self.close()

    @property
    def shard_name(self) -> str:
        return f"{self.index:06d}.tar"

    def _open(self) -> None:
        self._tmp = self.out_dir / f".{self.shard_name}.tmp{os.getpid()}"
        self._tar = tarfile.open(self._tmp, "w", format=tarfile.USTAR_FORMAT)
        self._count = 0
        self._stats = Counter()
        self._keys = set()

    def _finish(self) -> None:
        if self._tar is None:
            return
        name = self.shard_name
        with naming_errors(self.out_dir / name):  # a full disk names the shard
            self._tar.close()
        os.replace(self._tmp, self.out_dir / name)
        stats = {"shard": name, "count": self._count, **{k: v for k, v in sorted(self._stats.items())}}
        write_json_atomic(self.out_dir / f"{self.index:06d}_stats.json", stats)
        self.sizes[name] = self._count
        self._tar = None
        self.index += 1

    def write(self, sample: Sample) -> None:
        """Append one sample; validates the key, extension and required metadata (nothing is written for a
        sample that fails, so the caller may skip it and go on)."""
        ext, meta = self.validate(sample)
        with naming_errors(self.out_dir / self.shard_name):  # a full disk names the shard
            if self._tar is None:
                self._open()
            self._keys.add(sample.key)
            _add_member(self._tar, f"{sample.key}.{ext}", sample.image)
            _add_member(self._tar, f"{sample.key}.txt", sample.caption.encode("utf-8"))
            _add_member(self._tar, f"{sample.key}.json",
                        json.dumps(meta, sort_keys=True, ensure_ascii=False).encode("utf-8"))
        self._count += 1
        self.total += 1
        self._stats[f"captioner/{meta['captioner']}"] += 1
        self._stats[f"source/{meta['source']}"] += 1
        self._stats["image_bytes"] += len(sample.image)
        if self._count >= self.maxcount:
            self._finish()

    def validate(self, sample: Sample) -> tuple[str, dict]:
        """Raise :class:`ShardFormatError` if :meth:`write` would refuse ``sample``; returns (ext, json meta)."""
        if not _KEY_RE.match(sample.key):
            raise ShardFormatError(f"sample key {sample.key!r}: expected letters, digits, '_' or '-' only")
        ext = sample.ext.lower().lstrip(".")
        if ext not in IMAGE_EXTS:
            raise ShardFormatError(f"sample {sample.key}: image extension {sample.ext!r} not in {IMAGE_EXTS}")
        if "key" in sample.meta and sample.meta["key"] != sample.key:
            raise ShardFormatError(f"sample {sample.key}: json field 'key' is {sample.meta['key']!r}, "
                                   "expected the sample key")
        meta = {**sample.meta, "key": sample.key}
        for k in REQUIRED_META:
            if k not in meta:
                raise ShardFormatError(f"sample {sample.key}: json field {k!r} is required")
        if meta["source"] not in SOURCES:
            raise ShardFormatError(f"sample {sample.key}: json field 'source' must be one of {SOURCES}")
        if self._tar is not None and sample.key in self._keys:
            raise ShardFormatError(f"sample key {sample.key!r} written twice to shard {self.shard_name}")
        return ext, meta

    def abort(self) -> None:
        """Discard the shard being written (its temporary file); finished shards are kept."""
        if self._tar is not None:
            self._tar.close()
            self._tmp.unlink(missing_ok=True)
            self.total -= self._count
            self._tar = None

    def close(self) -> None:
        """Finish the open shard and merge ``sizes.json``."""
        self._finish()
        update_sizes(self.out_dir, self.sizes)


def update_sizes(out_dir: str | os.PathLike, sizes: dict[str, int]) -> None:
    """Merge ``sizes`` into ``out_dir/sizes.json`` (atomic)."""
    path = Path(out_dir) / "sizes.json"
    current = json.loads(path.read_text()) if path.exists() else {}
    current.update(sizes)
    write_json_atomic(path, dict(sorted(current.items())))


def expand_shards(spec: str | os.PathLike | Iterable[str | os.PathLike]) -> list[Path]:
    """Resolve a shard spec into a sorted list of tar paths.

    Accepts a folder (all ``*.tar`` in it), a glob, a brace pattern (``/d/{000000..000009}.tar``), a single
    tar, or a list of those. Raises ``FileNotFoundError`` naming the spec when nothing matches.
    """
    if not isinstance(spec, (str, os.PathLike)):
        out: list[Path] = []
        for s in spec:
            out.extend(expand_shards(s))
        return out
    import braceexpand

    s = os.fspath(spec)
    if _URL_RE.match(s):
        raise ShardFormatError(f"shards: {s} is a URL or pipe; local .tar shards are read here ({_CONVERT_HINT})")
    paths: list[Path] = []
    for pat in braceexpand.braceexpand(s):
        p = Path(pat)
        if p.is_file() and p.suffix.lower() in _NOT_SHARD_SUFFIXES:
            raise ShardFormatError(f"shards: {p} is a {p.suffix} file, not a .tar shard ({_CONVERT_HINT})")
        if p.is_dir():
            if not any(p.glob("*.tar")):
                raise FileNotFoundError(f"shards: no .tar files in {p} ({_CONVERT_HINT})")
            paths.extend(sorted(p.glob("*.tar")))
        elif any(c in pat for c in "*?["):
            paths.extend(Path(x) for x in sorted(glob.glob(pat)))
        elif p.exists():
            paths.append(p)
        elif "{" not in s:
            raise FileNotFoundError(f"shards: {s} does not exist")
    if not paths:
        raise FileNotFoundError(f"shards: no .tar files match {s}")
    for p in paths:
        if not p.is_file():  # a folder named *.tar, a FIFO or a device: reading it would fail or block
            raise ShardFormatError(f"shards: {p} is not a regular file")
    return paths


def _record(path: Path) -> object:
    """The parsed JSON of a count record (``None`` when missing or unreadable). One folder's ``sizes.json`` is
    parsed once, not once per shard (that was quadratic in shards): cached by path, inode, size and mtime."""
    try:
        st = path.stat()
    except OSError:
        return None
    return _parsed_record(str(path), st.st_ino, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _parsed_record(path: str, ino: int, size: int, mtime_ns: int) -> object:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _expected_count(path: Path) -> tuple[int, str] | tuple[None, None]:
    """The count ``sizes.json`` (or the shard's own ``NNNNNN_stats.json``) beside ``path`` records for it, and that
    file's name. In a ``_stats.json`` with ``successes`` (img2dataset's: its ``count`` counts download attempts,
    failed ones included) that is what the tar holds; else ``count`` (ours)."""
    sizes = path.parent / "sizes.json"
    stats = path.with_name(path.name.removesuffix(".tar") + "_stats.json")
    for record, fields in ((sizes, (path.name,)), (stats, ("successes", "count"))):
        obj = _record(record)
        if not isinstance(obj, dict):
            continue
        for field_ in fields:
            value = obj.get(field_)
            if isinstance(value, int) and not isinstance(value, bool):
                return value, record.name if record is sizes else f"{record.name} ({field_})"
    return None, None


def recorded_count(path: str | os.PathLike) -> int | None:
    """The sample count the folder records for shard ``path`` (``sizes.json``, else its ``_stats.json``: the rule
    of :func:`iter_shard`'s check), without reading the tar; ``None`` when nothing records it."""
    return _expected_count(Path(path))[0]


DUPLICATE = "duplicate"  # skip kind of a key seen before in the same shard (its first sample is kept)
BAD_CAPTION = "bad_caption"  # skip kind of a caption that is not valid UTF-8


def caption_text(data: bytes) -> str | None:
    """A caption's bytes as text, or None when they are not valid UTF-8 (skip the sample as ``bad_caption``:
    replacing the bad bytes would feed a detector and a selection text nobody wrote)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def bad_caption_reason(data: bytes) -> str:
    """The skip reason of a caption :func:`caption_text` refuses (names the first bad byte's offset)."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"caption is not valid UTF-8 (byte {e.start}: {data[e.start:e.start + 1]!r})"
    return "caption is valid UTF-8"


class SampleGroups:
    """Group a shard's members ``(name, read)`` into samples, one key at a time: the rule for repeated keys,
    shared by every reader of shards (``score``, ``select``, ``stats``, ``convert webdataset``).

    A sample is the run of members with one key (the text before the first dot of the base name); a member whose
    extension the current run already holds starts a new sample with the same key. A key seen before in the
    same shard (back to back or not) is a duplicate: its members are not read, it is not yielded, and it is
    counted in ``skipped`` (anything with ``add(key, reason, kind)``, e.g. a
    :class:`~halsift.corpus.images.SkipCounter`) as kind :data:`DUPLICATE`. Only the first sample of a key is
    yielded. Keys are not compared across shards: each shard is read (and scored) on its own; a key repeated in
    another shard makes ``select`` refuse the score folder (one line naming both parts).
    """

    def __init__(self, shard: str, skipped=None) -> None:
        self.shard, self.skipped = shard, skipped
        self.seen: set[str] = set()
        self.done = 0  # samples whose members all went by (duplicates included)
        self.duplicates = 0
        self.last = "(none)"  # key of the last sample whose members all went by

    def _duplicate(self, key: str) -> None:
        self.duplicates += 1
        if self.skipped is not None:
            self.skipped.add(key, f"key {key!r} repeats in shard {self.shard} (its first sample is kept)",
                             DUPLICATE)

    def __call__(self, members: Iterable[tuple[str, Callable[[], bytes]]],
                 cut: bool = False) -> Iterator[tuple[str, dict[str, bytes]]]:
        """Yield ``(key, {ext: bytes})`` of each first sample of a key. The sample pending when ``members`` raises
        (a damaged tail), or when they end in a tar known to be ``cut`` short, is not yielded."""
        cur: str | None = None
        dup = False
        parts: dict[str, bytes] = {}
        for name, read in members:
            base = name.rsplit("/", 1)[-1]
            if "." not in base:
                continue
            key, ext = base.split(".", 1)
            ext = ext.lower()
            if key != cur or ext in parts:
                if cur is not None:
                    self.done, self.last = self.done + 1, cur
                    if not dup:
                        yield cur, parts
                cur, parts, dup = key, {}, key in self.seen
                if dup:
                    self._duplicate(key)
                self.seen.add(key)
            parts[ext] = b"" if dup else read()
        if cur is not None and not cut:
            self.done, self.last = self.done + 1, cur
            if not dup:
                yield cur, parts


def shard_parts(path: str | os.PathLike, skipped=None) -> Iterator[tuple[str, dict[str, bytes]]]:
    """The samples of one tar as ``(key, {ext: bytes})``, grouped by :class:`SampleGroups` (a key's first sample
    only; a repeat is counted in ``skipped`` as ``duplicate``): the one tar reader of the package, for caption
    shards, CLIP_benchmark ``wds`` folders and evaluation images alike.

    A shard that cannot be opened, is truncated (a size that is not whole 512-byte tar blocks, a cut member) or
    holds fewer samples than ``sizes.json`` records raises ``ShardFormatError`` naming it, after the samples that
    were complete before the damage have been yielded.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"shard {path} does not exist")
    if not path.is_file():
        raise ShardFormatError(f"{path}: not a regular file")
    size = path.stat().st_size
    with open(path, "rb") as fh:
        compressed = fh.read(6).startswith((b"\x1f\x8b", b"BZh", b"\xfd7zXZ"))
    # tarfile silently treats a header cut short as the end of the archive, so check the size as well
    # (plain tars are whole 512-byte blocks; compressed ones are checked by their decompressor).
    damage = f"size {size} is not a whole number of 512-byte tar blocks" if size % 512 and not compressed else ""
    try:
        members = open_members(path, compressed, size)
    except (tarfile.TarError, OSError) as e:
        raise ShardFormatError(f"{path}: not a readable tar ({e})") from e
    groups = SampleGroups(path.name, skipped)
    try:
        yield from groups(members, cut=bool(damage))
    except (tarfile.TarError, OSError, EOFError) as e:
        damage = str(e)
    finally:
        members.close()
    expected, record = _expected_count(path)
    count = groups.done
    if damage:
        # The pending sample may be cut short: it is not yielded.
        lost = max(expected - count, 1) if expected is not None else None
        raise ShardFormatError(f"{path}: truncated or corrupt tar after sample {groups.last} ({damage}); "
                               f"{lost if lost is not None else 'an unknown number of'} sample(s) lost", lost)
    if expected is not None and count < expected:
        raise ShardFormatError(f"{path}: holds {count} samples but {record} records {expected} (truncated?)",
                               expected - count)


def iter_shard(path: str | os.PathLike, skipped=None) -> Iterator[Sample]:
    """Stream the samples of one tar (:func:`shard_parts`: a key's first sample only).

    A sample missing its image, caption or json is yielded with empty fields so that callers can skip it and
    count the reason. ``skipped`` (a :class:`~halsift.corpus.images.SkipCounter`) counts the samples left out
    here: a key repeated in the shard (kind ``duplicate``) and a caption that is not valid UTF-8 (kind
    ``bad_caption``); every command passes one, so they appear in its skip counts. A damaged shard raises
    ``ShardFormatError`` as :func:`shard_parts` does.
    """
    shard = Path(path).name
    for key, parts in shard_parts(path, skipped):
        ext = next((e for e in IMAGE_EXTS if e in parts), "")
        meta: dict = {}
        if "json" in parts:
            try:
                meta = json.loads(parts["json"].decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError):
                meta = {"_bad_json": True}
            if not isinstance(meta, dict):
                meta = {"_bad_json": True}
        caption = caption_text(parts.get("txt", b""))
        if caption is None:
            if skipped is not None:
                skipped.add(key, bad_caption_reason(parts["txt"]), BAD_CAPTION)
            continue
        yield Sample(key=key, image=parts.get(ext, b""), caption=caption, meta=meta, ext=ext, shard=shard)


def iter_samples(spec, skipped=None) -> Iterator[Sample]:
    """Stream every sample of every shard in ``spec`` (see :func:`expand_shards`).

    With ``skipped`` (a :class:`halsift.corpus.images.SkipCounter`), a corrupt or truncated shard is counted
    (kind ``corrupt_shard``, key = shard path) after its readable samples, and the stream goes on; without it
    the ``ShardFormatError`` propagates. ``skipped`` also counts what :func:`iter_shard` leaves out (``duplicate``,
    ``bad_caption``).
    """
    for path in expand_shards(spec):
        try:
            yield from iter_shard(path, skipped)
        except ShardFormatError as e:
            if skipped is None:
                raise
            skipped.add(str(path), str(e), "corrupt_shard", n=e.lost or 1)


def read_sizes(shard_dir: str | os.PathLike) -> dict[str, int]:
    """Return ``sizes.json`` of a shard folder; raises naming the file when missing or malformed."""
    path = Path(shard_dir) / "sizes.json"
    try:
        sizes = json.loads(path.read_text())
    except FileNotFoundError:
        raise ShardFormatError(f"{path}: missing (every shard folder has sizes.json)") from None
    except json.JSONDecodeError as e:
        raise ShardFormatError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(sizes, dict) or not all(isinstance(v, int) for v in sizes.values()):
        raise ShardFormatError(f"{path}: expected an object of shard name -> int count")
    return sizes
