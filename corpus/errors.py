"""The base of every "the input is wrong" error halsift raises (a malformed bench, shard, table, spec, QA file...):
the CLI reports any :class:`InputError` as one line with exit 2, without a traceback. A ``ValueError``, so code
that catches ``ValueError`` keeps working."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: the message names the file/field/key and what was expected."""


__all__ = ["InputError"]
