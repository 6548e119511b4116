"""Claims: how independent processes (SLURM array tasks, ``--num-tasks`` processes, a recipe's tasks) share one
run folder's parts with no process group and no barrier.

Claims (``_claims/<part>.<attempt>``) are written whole and hard-linked into place (a link fails when the name
exists, like ``O_CREAT | O_EXCL``): of two tasks reaching the same part exactly one wins attempt ``k``, and a claim
always holds its task's host and pid. The winner touches the file every ``stale_after / 10`` seconds. A claim is
*stale* when its process is gone (same host, pid not alive: a SIGKILL is noticed at once) or its heartbeat is older
than ``stale_after`` (another node died); a stale attempt ``k`` is taken over by creating attempt ``k + 1``, again
exclusively. The part's own record (:mod:`.run_folder`) is the completion marker; a claim only says who is making it.

Task ``i`` of ``n`` starts with its own share ``parts[i::n]`` and then takes any part no one holds (work stealing,
:func:`task_order`), so fast tasks absorb slow or dead ones and a rerun of any task finishes whatever is left.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halsift.corpus.errors import InputError

CLAIMS = "_claims"
TASKS = "_tasks"
STALE_AFTER_S = 600.0  # a claim whose heartbeat is older than this is taken over (another node died)
HOST = socket.gethostname()


class TaskError(InputError):
    """Bad task arguments (names the flag or variable and what was expected)."""


def task_from_env(num_tasks: int | None = None, task_index: int | None = None,
                  env: dict | None = None) -> tuple[int, int] | None:
    """``(num_tasks, task_index)`` from the arguments, else from a SLURM array task's environment; ``None`` when
    neither is given (an ordinary, rank-split run). The index is ``SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN``."""
    env = os.environ if env is None else env
    if num_tasks is None and task_index is None:
        if "SLURM_ARRAY_TASK_ID" not in env:
            return None
        try:
            num_tasks = int(env["SLURM_ARRAY_TASK_COUNT"])
            task_index = int(env["SLURM_ARRAY_TASK_ID"]) - int(env.get("SLURM_ARRAY_TASK_MIN", "0"))
        except (KeyError, ValueError) as e:
            raise TaskError(f"SLURM_ARRAY_TASK_ID/_COUNT/_MIN: expected integers ({e}); "
                            "pass --num-tasks and --task-index") from None
    if num_tasks is None:
        raise TaskError("--task-index: give --num-tasks too")
    if num_tasks < 1:
        raise TaskError(f"--num-tasks: expected >= 1, got {num_tasks}")
    task_index = 0 if task_index is None else task_index
    if not 0 <= task_index < num_tasks:
        raise TaskError(f"--task-index: expected 0 <= index < {num_tasks}, got {task_index}")
    return num_tasks, task_index


def task_order(parts: Sequence[Any], num_tasks: int, task_index: int, steal: bool = True) -> list[Any]:
    """The parts task ``task_index`` tries, in order: its own share ``parts[i::n]``, then (``steal``) the others'
    shares in task order after its own, so that tasks stealing from one another start at different places."""
    own = list(parts[task_index::num_tasks])
    if not steal:
        return own
    rest = [p for k in range(1, num_tasks) for p in parts[(task_index + k) % num_tasks::num_tasks]]
    return own + rest


# ---------------------------------------------------------------------------------------------- claims
def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@dataclass
class Claim:
    """One attempt at one part, held by this process while it scores the part."""

    path: Path

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def heartbeat(self, every: float) -> "Claim":
        def beat() -> None:
            while not self._stop.wait(every):
                try:
                    os.utime(self.path)
                except FileNotFoundError:
                    return
        self._thread = threading.Thread(target=beat, name=f"claim-{self.path.name}", daemon=True)
        self._thread.start()
        return self

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class ClaimBoard:
    """Exclusive, takeover-able claims on the parts of one output folder (see the module docstring)."""

    def __init__(self, out: Path, task: str, stale_after: float = STALE_AFTER_S) -> None:
        if stale_after <= 0:
            raise TaskError(f"--claim-timeout: expected > 0 seconds, got {stale_after}")
        self.dir = out / CLAIMS
        self.dir.mkdir(parents=True, exist_ok=True)
        self.task, self.stale_after = task, stale_after
        self.taken_over = 0

    def _attempts(self, part: str) -> list[tuple[int, Path]]:
        out = []
        for p in self.dir.glob(f"{part}.*"):
            tail = p.name[len(part) + 1:]
            if tail.isdigit():
                out.append((int(tail), p))
        return sorted(out)

    def is_stale(self, path: Path) -> bool:
        """True when the claim's process is gone (same host) or its heartbeat is older than ``stale_after``."""
        try:
            age = time.time() - path.stat().st_mtime
            info = json.loads(path.read_text() or "{}")
        except FileNotFoundError:
            return True
        except (json.JSONDecodeError, UnicodeDecodeError):
            info = {}  # being written this instant (create, then write): judged by its age alone
        if info.get("host") == HOST and isinstance(info.get("pid"), int) and not _pid_alive(info["pid"]):
            return True
        return age > self.stale_after

    def try_claim(self, part: str) -> Claim | None:
        """Claim ``part`` (a new attempt after a stale one), or ``None`` when a live task holds it."""
        attempts = self._attempts(part)
        if attempts:
            last, path = attempts[-1]
            if not self.is_stale(path):
                return None
            nxt = last + 1
        else:
            nxt = 0
        path = self.dir / f"{part}.{nxt}"
        # written whole, then hard-linked into place: the link fails if the attempt exists (exclusive, like
        # O_EXCL), and a claim never exists without its host and pid, even when the process dies right here
        tmp = self.dir / f".{part}.{nxt}.{HOST}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"host": HOST, "pid": os.getpid(), "task": self.task, "attempt": nxt,
                                   "time": time.time()}))
        try:
            os.link(tmp, path)
        except FileExistsError:
            return None  # another task won this attempt
        finally:
            tmp.unlink(missing_ok=True)
        self.taken_over += nxt > 0
        return Claim(path).heartbeat(max(0.5, self.stale_after / 10))

    def finish(self, part: str, claim: Claim) -> None:
        """The part is written: stop the heartbeat and remove every attempt's claim file."""
        claim.release()
        for _, p in self._attempts(part):
            p.unlink(missing_ok=True)

    def windows(self, parts: Iterable[Any], size: int, done: Callable[[Any], bool],
                tally: Callable[[str], None] = lambda _: None) -> Iterator[dict[str, tuple[Any, Claim]]]:
        """Claim up to ``size`` of ``parts`` at a time and yield them as ``{name: (part, claim)}``, skipping a part
        that is ``done`` (``tally("done")``) or held by a live task (``tally("held")``). The caller pops and finishes
        each part it writes; the claims left when it comes back or the generator closes (an error) are released:
        use it under ``contextlib.closing``."""
        it = iter(parts)
        while True:
            claimed: dict[str, tuple[Any, Claim]] = {}
            for p in it:
                if done(p):
                    tally("done")
                    continue
                claim = self.try_claim(p.name)
                if claim is None:
                    tally("held")
                    continue
                if done(p):  # finished between the check and the claim
                    self.finish(p.name, claim)
                    tally("done")
                    continue
                claimed[p.name] = (p, claim)
                if len(claimed) == size:
                    break
            if not claimed:
                return
            try:
                yield claimed
            finally:
                for name, (_, claim) in claimed.items():
                    self.finish(name, claim)

    def held(self, parts: Sequence[str]) -> list[str]:
        """The parts among ``parts`` that a live claim holds."""
        out = []
        for name in parts:
            att = self._attempts(name)
            if att and not self.is_stale(att[-1][1]):
                out.append(name)
        return out


def dist_timeout_kwargs(env: dict | None = None) -> dict:
    """``{"timeout": timedelta}`` from ``HALSIFT_DIST_TIMEOUT`` (seconds) for the rank-split run's process group:
    how long a barrier waits for the slowest rank (torch's default otherwise). ``{}`` when unset."""
    from datetime import timedelta

    raw = (os.environ if env is None else env).get("HALSIFT_DIST_TIMEOUT", "")
    if not raw:
        return {}
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if seconds <= 0:
        raise TaskError(f"HALSIFT_DIST_TIMEOUT={raw!r}: expected a number of seconds > 0")
    return {"timeout": timedelta(seconds=seconds)}


__all__ = ["CLAIMS", "Claim", "ClaimBoard", "HOST", "STALE_AFTER_S", "TASKS", "TaskError",
           "dist_timeout_kwargs", "task_from_env", "task_order"]
