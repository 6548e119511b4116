"""Names are names, and removals stay home: the two rules for every path halsift builds from a user's words.

**Names.** A recipe key that becomes a folder (a detector, trained detector, ensemble or select variant name, a
bench split) must be one safe path component (:func:`safe_component`): 1 to :data:`MAX_NAME` ASCII letters,
digits and ``. _ - + @ =``, starting with a letter or digit. So no ``/`` or ``\\``, no ``.``/``..``, no empty
name, no leading ``-`` (read as a flag) or ``.`` (hidden, temporary) or ``_`` (halsift's own ``_done.json``,
``_manifest.json``), no control characters, and nothing a shard pattern expands (``{ } * ? [ ]``, ``,``).

**Removals.** Every folder halsift removes or replaces goes through :func:`remove_tree`, :func:`remove_file` or
:func:`replace_path`. Inside :func:`confined_to(root) <confined_to>` (``halsift run`` holds its run folder) the
target, with symlinks resolved, must lie strictly inside ``root``; always, it may not be the file system root,
the home folder, the current folder or a folder above it. Otherwise :class:`UnsafePathError` is raised and
nothing is touched.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

from halsift.corpus.errors import InputError

MAX_NAME = 100
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+@=-]*")
NAME_RULE = (f"1-{MAX_NAME} ASCII letters, digits and '.', '_', '-', '+', '@', '=', starting with a letter or "
             "digit")
_ROOTS: list[Path] = []  # the confinement roots, innermost last (process-wide: worker threads see them too)


class UnsafePathError(InputError):
    """A name that is not a safe path component, or a removal outside the folder a run may change."""


def safe_component(name: str, where: str, is_key: bool = True) -> str:
    """``name`` if it is one safe path component (see the module doc), else :class:`UnsafePathError` naming the
    recipe key: ``where.name`` when ``name`` is a key of section ``where``, else ``where`` and the value."""
    if isinstance(name, str) and len(name) <= MAX_NAME and _NAME.fullmatch(name) is not None:
        return name
    shown = repr(name if not isinstance(name, str) or len(name) <= 80 else name[:80] + "...")
    key = f"{where}.{name}" if is_key and isinstance(name, str) and name.isprintable() and len(name) <= 80 else where
    raise UnsafePathError(f"{key}: {shown} is not a safe folder name; expected {NAME_RULE}")


@contextlib.contextmanager
def confined_to(root: str | os.PathLike) -> Iterator[Path]:
    """Within the block, every removal or replacement must lie strictly inside ``root`` (symlinks resolved)."""
    resolved = Path(root).resolve()
    _ROOTS.append(resolved)
    try:
        yield resolved
    finally:
        _ROOTS.remove(resolved)


def _resolved(path: Path, follow: bool) -> Path:
    """``path`` with its symlinks resolved; with ``follow`` false the last component is kept as it is (unlinking
    a symlink removes the link, not what it points to)."""
    if follow or path.name in ("", ".", ".."):
        return path.resolve()
    return path.parent.resolve() / path.name


def check_removable(path: str | os.PathLike, action: str = "remove", follow: bool = True) -> Path:
    """The resolved ``path`` if halsift may ``action`` it here (see the module doc), else :class:`UnsafePathError`."""
    target = _resolved(Path(path), follow)
    if _ROOTS and (target == _ROOTS[-1] or not target.is_relative_to(_ROOTS[-1])):
        raise UnsafePathError(f"refusing to {action} {path} ({target}): it is not inside the run folder "
                              f"{_ROOTS[-1]}")
    try:
        cwd, home = Path.cwd().resolve(), Path.home().resolve()
    except (OSError, RuntimeError, KeyError):  # the current folder is gone, or no home folder is known
        cwd = home = None
    if target == Path(target.anchor) or target == home or (cwd is not None and cwd.is_relative_to(target)):
        raise UnsafePathError(f"refusing to {action} {path} ({target}): the file system root, the home folder, "
                              "the current folder or a folder above it")
    return target


def remove_tree(path: str | os.PathLike, ignore_errors: bool = False) -> None:
    """``shutil.rmtree(path)`` after :func:`check_removable`; a missing ``path`` is fine."""
    check_removable(path)
    if ignore_errors or os.path.lexists(path):
        shutil.rmtree(path, ignore_errors=ignore_errors)


def remove_file(path: str | os.PathLike, missing_ok: bool = True) -> None:
    """``Path(path).unlink()`` after :func:`check_removable` (a symlink itself is removed, not its target)."""
    check_removable(path, follow=False)
    Path(path).unlink(missing_ok=missing_ok)


def replace_path(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """``os.replace(src, dst)`` (a folder moved into place) after checking both ends."""
    check_removable(src, "move", follow=False)
    check_removable(dst, "replace", follow=False)
    os.replace(src, dst)
