"""The error of a bad detector spec (its own module, so that the spec parser and the trust rule both raise it)."""

from __future__ import annotations

from halsift.corpus.errors import InputError


class SpecError(InputError):
    """A detector spec is malformed; the message names the spec, key and value, and what was expected."""
