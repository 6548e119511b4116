"""``halsift score --embeddings DIR``: give ``embeddings=DIR`` to every CLIP-family detector of a spec (the spec
itself, or an ensemble's members), so that none of them encodes what ``halsift embed`` stored."""

from __future__ import annotations

import os
from typing import Any

from halsift.filtering.detectors.spec import SpecError, _is_spec_file, format_spec, parse_spec

EMBEDDING_FAMILIES = ("clip",)  # the families that read an embeddings folder (their option ``embeddings``)


def _rewrite(spec: str, folder: str) -> tuple[str, int]:
    family, opts = parse_spec(spec)
    if family in EMBEDDING_FAMILIES:
        return format_spec(family, {**opts, "embeddings": folder}), 1
    members = opts.get("members")
    if isinstance(members, list):
        done = [_rewrite(m, folder) if isinstance(m, str) else (m, 0) for m in members]
        if sum(n for _, n in done):
            return format_spec(family, {**opts, "members": "[" + ";".join(m for m, _ in done) + "]"}), \
                sum(n for _, n in done)
    return spec, 0


def with_embeddings(spec: Any, folder: str | os.PathLike) -> str:
    """``spec`` with ``embeddings=folder`` on each CLIP-family detector; a :class:`SpecError` (one line) when it has
    none, or is not a spec string (a spec file or an object: put ``embeddings=`` in it)."""
    if not isinstance(spec, str) or _is_spec_file(spec):
        raise SpecError(f"--embeddings: give the detector as a spec string, or set embeddings={folder} in its spec "
                        "file")
    out, n = _rewrite(spec, os.fspath(folder))
    if not n:
        raise SpecError(f"--embeddings: detector spec {spec!r} has no CLIP-family detector "
                        f"({', '.join(EMBEDDING_FAMILIES)}) to read them")
    return out


def reads_embeddings(spec: Any) -> bool:
    """Whether :func:`with_embeddings` can give ``spec`` an embeddings folder (a spec string with a CLIP-family
    detector in it): a recipe's ``score.embeddings`` applies to those detectors and leaves the others as they are."""
    if not isinstance(spec, str) or _is_spec_file(spec):
        return False
    try:
        return _rewrite(spec, "-")[1] > 0
    except SpecError:
        return False


__all__ = ["EMBEDDING_FAMILIES", "reads_embeddings", "with_embeddings"]
