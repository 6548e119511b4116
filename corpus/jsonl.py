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
