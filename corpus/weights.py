"""Model weights come only from safetensors files: a file given as weights (``clip:checkpoint=``, ``train clip
--pretrained``, a checkpoint's ``model.safetensors``) is checked before any loader opens it, so a pickle (``.pt``,
``.bin``, ``.pth``) is refused in one line naming it and is never unpickled, not even by ``torch.load``'s restricted
unpickler. The check reads the name and the first bytes: a ``.safetensors`` name (loaders pick the format by it)
and no pickle or torch.save archive inside; a damaged safetensors file is left to the safetensors reader, whose
error the loaders report naming the file.
"""

from __future__ import annotations

import os
from pathlib import Path

from halsift.corpus.errors import InputError

HINT = ("safetensors expected: halsift never unpickles weights (convert a checkpoint you trust with "
        "safetensors.torch.save_file)")


class WeightsFormatError(InputError):
    """A weights or checkpoint file that is refused or cannot be loaded; the message names it."""


def _pickled(head: bytes, size: int) -> str | None:
    """What pickled format a file of ``size`` bytes starting with ``head`` (9 bytes) holds; None for anything
    else, and for a safetensors header (an 8-byte length that fits in the file, then ``{``)."""
    if len(head) == 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= size - 8:
        return None
    if head.startswith(b"PK\x03\x04"):
        return "a torch.save zip archive"
    if head[:1] == b"\x80" and head[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        return "a Python pickle"
    return None


def require_safetensors(path: str | os.PathLike, what: str = "weights") -> Path:
    """``path`` if it is a file named ``*.safetensors`` that does not hold a pickle; else
    :class:`WeightsFormatError` (``what``, e.g. ``checkpoint``, names the option it came from) or FileNotFoundError."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what}: {path} is not a file")
    with open(path, "rb") as f:
        pickled = _pickled(f.read(9), path.stat().st_size)
    if pickled or path.suffix != ".safetensors":
        found = f"it holds {pickled}" if pickled else f"a {path.suffix or 'suffix-less'} file, not *.safetensors"
        raise WeightsFormatError(f"{what}: {path} is not a safetensors file ({found}); {HINT}")
    return path


def read_safetensors(path: str | os.PathLike, what: str = "weights") -> dict:
    """The tensors of a ``.safetensors`` file (checked by :func:`require_safetensors` first); a damaged file is a
    ValueError naming ``what`` and the path. The one reader of weight files for every loader."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = require_safetensors(path, what)
    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"{what}={str(path)!r}: not a valid safetensors file ({e})") from None


__all__ = ["WeightsFormatError", "read_safetensors", "require_safetensors"]
