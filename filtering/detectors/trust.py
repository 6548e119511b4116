"""Trust: where the two privileged detector options may come from.

``trust_remote_code`` lets a model folder's own Python run; ``api_key_env`` chooses which environment variable is
sent to a server as the API key. The rule (:func:`apply`), enforced where every detector is built from a spec
(``spec._build``) and where the dry run checks specs (``spec.iter_specs``):

* **The user's own text sets them**: a spec typed on the command line (``--detector``, ``--base``, ``--answerer``,
  or a command's ``--config`` file), a spec string written in their recipe (``score.detectors.NAME``,
  ``detectors.NAME.base``, ``evals.ihalla.answerer``; ensemble members written inline in that string included),
  a spec string or dict passed by their own Python code.
* **A file that a detector loads never does**, at any depth: a YAML spec file (also one named on the command line or
  in a recipe), an adapter folder's ``detector.yaml``, and whatever those name in turn (:func:`from_file`). There
  ``trust_remote_code`` is dropped with a :class:`TrustWarning` naming the file (the load goes on without the model's
  code; a model that needs it then fails with its own error) and an ``api_key_env`` other than the default
  ``OPENAI_API_KEY`` is refused with a one-line error naming the file and key.
* ``lora:DIR,trust_remote_code=true`` written by the user grants remote code to every model that adapter loads.

Dropping versus refusing: dropping ``trust_remote_code`` only withholds a privilege, and adapters written by
``train detector`` from a remote-code base record it in their ``detector.yaml``: they stay loadable, and the warning
says how to grant it. A file choosing ``api_key_env`` is never legitimate, and dropping it would still send a key to
the server the file names: that is refused before anything is sent.

Option keys are normalized by the spec parser before the rule (``spec.normalize_key``: spaces stripped, lower case,
``-`` read as ``_``), so ``api_key_env =X``, ``API-KEY-ENV: X`` and ``Trust-Remote-Code`` are the same options.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from halsift.filtering.detectors.spec_error import SpecError

REMOTE_CODE = "trust_remote_code"
KEY_ENV = "api_key_env"
DEFAULT_KEY_ENV = "OPENAI_API_KEY"
_HARMLESS_KEY_ENV = (None, "", DEFAULT_KEY_ENV)  # what a file may still say: the default, or no key at all


class TrustWarning(UserWarning):
    """A file that a detector loads asked for ``trust_remote_code``; it was dropped."""


@dataclass(frozen=True)
class FileSource:
    """A file whose options are being built; ``remote_code``: the user granted remote code to what it loads."""

    path: str
    remote_code: bool = False


_SOURCE: ContextVar[FileSource | None] = ContextVar("halsift_spec_source", default=None)


def current_source() -> FileSource | None:
    """The file whose options are being built now; None while building the user's own spec."""
    return _SOURCE.get()


@contextmanager
def from_file(path: str | os.PathLike, remote_code: bool = False) -> Iterator[FileSource]:
    """Every detector built inside comes from ``path``, a file that a detector loads. ``remote_code`` is the user's
    grant for what it loads (``lora:DIR,trust_remote_code=true``); an enclosing file's grant carries on inside."""
    outer = _SOURCE.get()
    token = _SOURCE.set(FileSource(os.fspath(path), bool(remote_code) or bool(outer and outer.remote_code)))
    try:
        yield _SOURCE.get()
    finally:
        _SOURCE.reset(token)


def apply(opts: dict[str, Any], takes: Collection[str]) -> dict[str, Any]:
    """The rule on one detector's options (keys already normalized); ``takes``: the options its family accepts.
    The user's own options (no :func:`from_file` around) are returned unchanged."""
    src = _SOURCE.get()
    if src is None:
        return opts
    out = dict(opts)
    env = out.get(KEY_ENV)
    if env not in _HARMLESS_KEY_ENV:
        raise SpecError(f"{src.path}: {KEY_ENV}={env!r} is refused: a file that a detector loads may not choose which "
                        f"environment variable is sent as the API key; write it in your own spec (--detector "
                        f"api:...,{KEY_ENV}=NAME, or your recipe's score.detectors) or use {DEFAULT_KEY_ENV}")
    if out.pop(REMOTE_CODE, None) not in (None, False) and not src.remote_code:
        warnings.warn(f"{src.path}: {REMOTE_CODE} ignored: a file that a detector loads cannot turn it on; write it "
                      f"in your own spec (for an adapter folder: lora:path=DIR,{REMOTE_CODE}=true)", TrustWarning,
                      stacklevel=2)
    if src.remote_code and REMOTE_CODE in takes:
        out[REMOTE_CODE] = True
    return out


def privileges(opts: dict[str, Any]) -> list[str]:
    """``key=value`` of each privileged option ``opts`` turns on (for notes such as the recipe dry run's)."""
    used = [f"{REMOTE_CODE}=true"] if opts.get(REMOTE_CODE) not in (None, False) else []
    if opts.get(KEY_ENV) not in _HARMLESS_KEY_ENV:
        used.append(f"{KEY_ENV}={opts[KEY_ENV]}")
    return used


__all__ = ["DEFAULT_KEY_ENV", "FileSource", "KEY_ENV", "REMOTE_CODE", "TrustWarning", "apply", "current_source",
           "from_file", "privileges"]
