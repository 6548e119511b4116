"""Line-by-line JSONL reading with errors that name ``file:line`` (shared by every JSONL format reader)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def iter_jsonl(path: str | os.PathLike, error: type[Exception] = ValueError) -> Iterator[tuple[str, int, Any]]:
    """Yield ``(where, lineno, obj)`` for each non-blank line; invalid JSON raises ``error("file:line: ...")``.

    Undecodable bytes are replaced rather than fatal: the JSON parser then names the line they broke.
    """
    path = Path(path)
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise error(f"{where}: not valid JSON ({e.msg})") from e
            yield where, lineno, obj


def read_json(path: str | os.PathLike, error: type[Exception] = ValueError, what: str = "file",
              expect: type = dict) -> Any:
    """A whole JSON file whose top level is ``expect`` (dict or list); errors name the file and what it is for."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what}: {path} does not exist")
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise error(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from e
    if not isinstance(obj, expect):
        kind = "a JSON object" if expect is dict else "a JSON list"
        raise error(f"{path}: expected {kind} at the top level ({what}), got {type(obj).__name__}")
    return obj
