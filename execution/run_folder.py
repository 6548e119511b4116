"""One run folder: what produced it, whether a rerun may reuse it, which parts are done, who is making which, how it
ended: the execution layer's one notion of "done".

Every stage that writes a folder of parts (``score``, ``embed``, ``dedup``, ``basic``, ``select``, a cascade's
stages; ``annotate``'s draw and ``train --resume``'s ``config.json`` by its identity rule) keeps its state through
this module (:class:`RunFolder`), and every engine (:mod:`.engines`) asks it which parts are done, so one set of rules
holds everywhere (DESIGN.md, "The execution layer"):

* **Identity** (:func:`check_or_start`): the folder's record (its manifest) names what produced it: the stage's
  identity keys (detector, model, inputs ...) and its resolved ``settings`` (those that change what is computed;
  settings that only change how a stage runs, such as decode workers, engine, device or worker counts, are left
  out). A rerun whose identity differs is refused in one line naming the folder and the first differing key. A
  setting absent from an old record compares equal only to its default (:func:`settings_diff`): adding a setting
  with a default does not refuse old folders, a changed default does.
* **Parts done** (:func:`part_done`, :func:`part_reusable`): a part is hashed whole when written (its record,
  ``_done/<part>.json``, holds its size, content hash and what it was made from, e.g. its input's content
  fingerprint, :mod:`halsift.corpus.fingerprint`); a rerun reuses it only when the record matches what the part
  would be made from now and the file still has the recorded content. A part without a record (written before
  records existed) is judged by the stage's older rule (``legacy``), or made again.
* **Claims** (:meth:`RunFolder.claims`): who is making which part now (:mod:`.claims`); never a completion marker.
* **End** (:func:`mark_failed`, :func:`failing`): a run stopped by an error leaves its record ``failed`` with the
  reason (never ``running``), so that readers say why and a rerun starts over where it can.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from halsift.corpus.records import DONE, RunFolderError, content, has_content, part_record, read_record, record_path
from halsift.corpus.shards import write_json_atomic

MANIFEST = "_manifest.json"
_MISSING = object()


def settings_diff(old: Mapping | None, new: Mapping, defaults: Mapping | None = None) -> str | None:
    """The first setting of ``new`` whose value differs from ``old``'s; a setting absent from ``old`` (an older
    record) compares equal only to its default in ``defaults`` (and to nothing when it has none)."""
    old, defaults = old or {}, defaults or {}
    for key, value in new.items():
        before = old[key] if key in old else defaults.get(key, _MISSING)
        if before != value:
            return key
    return None


def identity_diff(old: Mapping, new: Mapping, keys: Iterable[str], defaults: Mapping | None = None) -> str | None:
    """The first key of ``keys`` whose value differs between two identities, then the first differing setting
    (``settings.NAME``, :func:`settings_diff`); ``None`` when they agree."""
    for key in keys:
        if old.get(key) != new.get(key):
            return key
    if "settings" in new:
        key = settings_diff(old.get("settings"), new["settings"], defaults)
        if key is not None:
            return f"settings.{key}"
    return None


def _value(record: Mapping, key: str, defaults: Mapping | None):
    if key.startswith("settings."):
        name = key.split(".", 1)[1]
        settings = record.get("settings") or {}
        return settings[name] if name in settings else (defaults or {}).get(name)
    return record.get(key)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def refusal(folder: Path, key: str, old: Mapping, new: Mapping, what: str, defaults: Mapping | None = None,
            hint: str = "use a new --out folder") -> str:
    """The one line refusing a folder whose identity differs at ``key`` (a setting by its own name)."""
    name = key.split(".", 1)[1] if key.startswith("settings.") else key
    return (f"{folder}: holds {what} with a different {name} ({_short(_value(old, key, defaults))} vs "
            f"{_short(_value(new, key, defaults))}); {hint}")


def check_or_start(folder: str | os.PathLike, ident: dict, *, keys: Iterable[str], what: str,
                   manifest: str = MANIFEST, error: type[Exception] = RunFolderError,
                   defaults: Mapping | Callable[[dict], Mapping] | None = None, parts_glob: str = "part-*.parquet",
                   start: Callable[[], bool] | bool = True, hint: str = "use a new --out folder",
                   prefix: str = "") -> dict | None:
    """Check ``folder`` against ``ident`` (``keys`` compared as they are, ``ident["settings"]`` by
    :func:`settings_diff` with ``defaults``, or ``defaults(old record)`` for a stage whose older records kept a setting
    elsewhere), then, when ``start`` (or ``start()``) is true, write its record
    ``{**ident, "status": "running"}``. Returns the old record (``None`` for a new folder). Raises ``error`` (one
    line naming the folder and the key, after ``prefix``, e.g. ``"--out: "``) when it holds another run, or parts
    without a record."""
    folder = Path(folder)
    old = read_record(folder / manifest, error, prefix, hint)
    if old is not None:
        defaults = defaults(old) if callable(defaults) else defaults
        key = identity_diff(old, ident, keys, defaults)
        if key is not None:
            raise error(prefix + refusal(folder, key, old, ident, what, defaults, hint))
    elif parts_glob and folder.is_dir() and any(folder.glob(parts_glob)):
        raise error(f"{prefix}{folder}: holds parts but no {manifest}; {hint}")
    if start() if callable(start) else start:
        folder.mkdir(parents=True, exist_ok=True)
        write_json_atomic(folder / manifest, {**ident, "status": "running"})
    return old


# ------------------------------------------------------------------------------------------------ parts
def part_done(folder: str | os.PathLike, name: str, made_from: Mapping, run: Mapping | None = None,
              empty: bool = False) -> dict:
    """Record part ``name`` of ``folder`` as finished: its whole-content hash and ``made_from`` (what it was made
    from, e.g. ``{"source_fp": ..., "detector_fp": ...}``), and ``run`` (how this run made it: rank, timings; kept
    out of the part itself, whose bytes then depend only on what it was made from). Call it right after the part is
    written. ``empty``: the part rightly has no file (e.g. a shard whose every sample was dropped); its record says
    so and it is done like any other."""
    what = {"empty": True} if empty else content(Path(folder) / name)
    record = {**what, **made_from, **({"run": dict(run)} if run else {})}
    (Path(folder) / DONE).mkdir(exist_ok=True)
    write_json_atomic(record_path(folder, name), record)
    return record


def part_reusable(folder: str | os.PathLike, name: str, made_from: Mapping,
                  legacy: Callable[[Path], bool] | None = None) -> bool:
    """Whether part ``name`` may be reused: its record says it was made from ``made_from`` and the file has the
    recorded content (altered, swapped or rewritten parts are made again). A part without a record is judged by
    ``legacy(path)`` (the stage's rule for folders written before records), else made again."""
    path = Path(folder) / name
    rec = part_record(folder, name)
    if not path.exists():  # done only as a part recorded empty (:func:`part_done`)
        return bool(rec and rec.get("empty")) and all(rec.get(k) == v for k, v in made_from.items())
    if rec is None:
        return bool(legacy is not None and legacy(path))
    return all(rec.get(k) == v for k, v in made_from.items()) and has_content(path, rec)


def content_digest(folder: str | os.PathLike, manifest: str = MANIFEST) -> str | None:
    """A finished folder's identity by content: the size and hash recorded for each of its parts (a score
    manifest's ``part_records``, else each part's record in ``_done/``), not the manifest's own bytes, which an
    identical rerun rewrites with new timings, nor its path (a copy is the same folder). ``None`` when it records
    no part."""
    import hashlib
    import json

    folder = Path(folder)
    try:
        recs = (read_record(folder / manifest) or {}).get("part_records")
    except RunFolderError:
        recs = None
    if not recs:
        recs = {f.name.removesuffix(".json"): part_record(folder, f.name.removesuffix(".json")) or {}
                for f in (folder / DONE).glob("*.json")}
    if not recs:
        return None
    sizes_and_hashes = {name: [r.get("size"), r.get("hash")] for name, r in sorted(recs.items())}
    return hashlib.blake2b(json.dumps(sizes_and_hashes).encode(), digest_size=16).hexdigest()


def forget_part(folder: str | os.PathLike, name: str) -> None:
    """Remove part ``name``'s record (before the part is written again)."""
    record_path(folder, name).unlink(missing_ok=True)


# ------------------------------------------------------------------------------------------------ end
def mark_failed(folder: str | os.PathLike, reason: str, manifest: str = MANIFEST) -> None:
    """Leave the folder's record ``failed`` with ``reason`` (its other entries kept)."""
    path = Path(folder) / manifest
    try:
        old = read_record(path) or {}
    except RunFolderError:
        old = {}
    write_json_atomic(path, {**old, "status": "failed", "error": reason[:2000]})


@contextmanager
def failing(folder: str | os.PathLike, manifest: str = MANIFEST) -> Iterator[None]:
    """Run a stage's body; an exception (not an interrupt: a killed run stays ``running``, to be resumed) leaves the
    folder's record ``failed`` with its one line, then propagates."""
    try:
        yield
    except Exception as e:
        path = Path(folder) / manifest
        if path.exists():
            try:
                rec = read_record(path) or {}
            except RunFolderError:
                rec = {}
            if not (rec.get("status") == "failed" and rec.get("error")):  # the stage's own reason stands
                mark_failed(folder, str(e).splitlines()[0] if str(e) else type(e).__name__, manifest)
        raise


# ------------------------------------------------------------------------------------------------ owned folders
OWNED = "_made_from.json"  # a folder a pipeline owns whole: what made it (a recipe's trained detector, fine-tune)


def holds(folder: str | os.PathLike, ident: Mapping, record: str = OWNED) -> bool:
    """Whether a folder a pipeline owns whole (one output, no parts of its own: a trained adapter, a fine-tuning
    run) holds what ``ident`` makes: its record (:func:`made`) says so."""
    try:
        old = read_record(Path(folder) / record)
    except RunFolderError:
        return False
    return old is not None and identity_diff(old, dict(ident), list(ident)) is None


def made(folder: str | os.PathLike, ident: Mapping, record: str = OWNED) -> None:
    """Record what made an owned folder (after its output is complete)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    write_json_atomic(Path(folder) / record, {**ident, "status": "complete"})


def clear_unless(folder: str | os.PathLike, ident: Mapping, record: str = OWNED) -> bool:
    """``True`` when an owned folder holds what ``ident`` makes (:func:`holds`: finished, or stopped on the way, so
    that the caller's run resumes from its checkpoints); otherwise whatever it holds came from something else: it is
    removed (inside the removal guard of :mod:`halsift.corpus.safe_paths`), its record started (``running``, so a
    run stopped on the way keeps what it made) and ``False`` returned, so the caller makes it again."""
    from halsift.corpus.safe_paths import remove_tree

    if holds(folder, ident, record):
        return True
    if Path(folder).exists():
        remove_tree(folder)
    Path(folder).mkdir(parents=True)
    write_json_atomic(Path(folder) / record, {**ident, "status": "running"})
    return False


# ------------------------------------------------------------------------------------------------ the folder
class RunFolder:
    """One stage folder as the execution layer sees it: its record (``manifest``), its parts' records, its claims and
    its status. A job (:mod:`.job`) opens one; every engine asks it the same questions."""

    def __init__(self, path: str | os.PathLike, manifest: str = MANIFEST) -> None:
        self.path, self.manifest = Path(path), manifest

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    def record(self, error: type[Exception] = RunFolderError, prefix: str = "") -> dict | None:
        """The folder's record (``None`` when it has none)."""
        return read_record(self.path / self.manifest, error, prefix)

    @property
    def status(self) -> str | None:
        """``running``, ``failed``, ``complete`` (``None``: no record, or an unreadable one)."""
        try:
            rec = self.record()
        except RunFolderError:
            return None
        return None if rec is None else rec.get("status")

    def check_or_start(self, ident: dict, **kw) -> dict | None:
        """:func:`check_or_start` on this folder and its record."""
        return check_or_start(self.path, ident, manifest=self.manifest, **kw)

    def claims(self, task: str, stale_after: float):
        """The folder's claim board (:class:`~halsift.execution.claims.ClaimBoard`)."""
        from halsift.execution.claims import ClaimBoard

        return ClaimBoard(self.path, task, stale_after)

    def failing(self):
        """:func:`failing` for this folder."""
        return failing(self.path, self.manifest)


__all__ = ["DONE", "MANIFEST", "OWNED", "RunFolder", "RunFolderError", "check_or_start", "clear_unless", "content",
           "content_digest",
           "failing", "forget_part", "has_content", "holds", "identity_diff", "made", "mark_failed", "part_done",
           "part_record", "part_reusable", "read_record", "refusal", "settings_diff"]
