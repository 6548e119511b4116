"""Scoring as independent tasks: SLURM array tasks, Ray actors or plain processes sharing one score folder.

No process group, no barrier: each task is one process that scores the parts (:func:`parts.plan_parts`) it can
*claim*, writes each finished part atomically into the same folder a single process would (so ``select`` reads it
as it is, no merge step), and exits. Task ``i`` of ``n`` starts with its own share ``parts[i::n]`` and then takes
any part no one holds (work stealing), so fast tasks absorb slow or dead ones and a rerun of any task finishes
whatever is left.

Claims (``_claims/<part>.<attempt>``) are written whole and hard-linked into place (a link fails when the name
exists, like ``O_CREAT | O_EXCL``): of two tasks reaching the same part exactly one wins attempt ``k``, and a claim
always holds its task's host and pid. The winner touches the file every ``stale_after / 10``
seconds. A claim is *stale* when its process is gone (same host, pid not alive: a SIGKILL is noticed at once) or
its heartbeat is older than ``stale_after`` (another node died); a stale attempt ``k`` is taken over by creating
attempt ``k + 1``, again exclusively. The part file itself is the completion marker: parts are written through a
temporary name, and a part that exists is never redone. Scores are a deterministic function of the part, so even a
part scored twice (a claim judged stale whose owner was merely slow) is written twice with the same content.

Each task run records its stats in ``_tasks/``; the task that finds every part written merges them into
``_manifest.json`` with ``status: complete``. Until then the manifest says ``running``.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from halsift.corpus.errors import InputError
from halsift.corpus.progress import progress
from halsift.corpus.run_folder import failing
from halsift.corpus.shards import write_json_atomic
from halsift.filtering.scoring.parts import MANIFEST, Part, Run, finish_manifest, reusable, score_part, start_run
from halsift.filtering.scoring.guard import DEFAULT_MAX_PARSE_FAILURES, ScoreGuard
from halsift.filtering.scoring.threads import torch_threads

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


def task_order(parts: Sequence[Part], num_tasks: int, task_index: int, steal: bool = True) -> list[Part]:
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


# ---------------------------------------------------------------------------------------------- one task
def task_device() -> str:
    """A task's device: its (first visible) GPU, or the CPU when there is none or HALSIFT_FORCE_CPU is set."""
    import torch

    return "cuda" if torch.cuda.is_available() and not os.environ.get("HALSIFT_FORCE_CPU") else "cpu"


def part_done(out: Path, part: Part, fps: dict | None = None) -> bool:
    """The completion marker: the part's parquet file (written atomically) is there and, given ``fps`` (its
    :func:`part_fingerprints` entry), was made from the same shard by the same detector and still holds what was
    written (:func:`parts.reusable`; else it is redone)."""
    if fps is None:
        return (out / part.name).exists()
    return reusable(out, part.name, fps)


class _Solo:
    """The accelerate-state surface :func:`parts.check_or_start` uses, for a lone task process."""

    is_main_process = True

    @staticmethod
    def wait_for_everyone() -> None:
        pass


def start_solo_run(job, engine: str) -> Run:
    """The start shared by every engine whose processes score parts alone (tasks, Ray): :func:`parts.start_run`,
    refusing a set-level detector (whose scores would be per part)."""
    job.validate()

    def refuse(detector) -> None:
        if detector.set_level:
            raise TaskError(f"{engine}: {detector.name} scores at set level (e.g. an ensemble's rank/zscore norm "
                            "normalises over the whole set); score each member into its own folder, or run it "
                            f"without {engine}")

    return start_run(job, _Solo, refuse)


def score_task(job, num_tasks: int, task_index: int, *, stale_after: float = STALE_AFTER_S,
               steal: bool = True) -> dict:
    """Run task ``task_index`` of ``num_tasks`` of ``job`` (a :class:`~halsift.filtering.scoring.engine.ScoreJob`,
    passed whole); returns this run's stats. ``job.decode_workers`` > 0: the task's input pipeline runs in that many
    processes (:mod:`.workers`), one claimed part per worker at a time, with torch's threads set beside them
    (:mod:`.threads`), as in the rank-split run.

    ``complete`` in the result is true when every part exists after this task (then ``_manifest.json`` is
    complete); ``held_by_live_tasks`` lists the missing parts that running tasks hold.
    """
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        raise TaskError("--num-tasks: each task is one process; do not run it under torchrun/accelerate launch")
    t0 = time.perf_counter()
    run_ = start_solo_run(job, "--num-tasks")
    with failing(run_.out):
        return _task(job, run_, num_tasks, task_index, stale_after, steal, t0)


def _task(job, run_: Run, num_tasks: int, task_index: int, stale_after: float, steal: bool, t0: float) -> dict:
    detector, out, parts, ident = run_.detector, run_.out, run_.parts, run_.ident
    fps = run_.fps()
    unit, batch_size, decode_workers = job.unit, job.batch_size, job.decode_workers
    guard = ScoreGuard(detector.name, job.max_parse_failures)
    resumed = sum(1 for p in parts if part_done(out, p, fps[p.name]))
    name = f"task-{task_index:05d}"
    board = ClaimBoard(out, f"{name}@{HOST}:{os.getpid()}", stale_after)
    run = {"task_index": task_index, "num_tasks": num_tasks, "host": HOST, "pid": os.getpid(), "start": time.time(),
           "parts_scored": 0, "parts_skipped_done": 0, "parts_held_elsewhere": 0, "sentences": 0}
    from halsift.filtering.scoring.workers import score_parts_in_workers, supports_workers

    use_workers = decode_workers > 0 and supports_workers(detector)
    # with decode workers, up to one claimed part per worker is scored at a time (a part is read by one worker)
    window = decode_workers if use_workers else 1
    loaded, bar = False, None
    ts = time.perf_counter()
    order = iter(task_order(parts, num_tasks, task_index, steal))
    counts = {"done": "parts_skipped_done", "held": "parts_held_elsewhere"}

    def tally(kind: str) -> None:
        run[counts[kind]] += 1

    with torch_threads(decode_workers if use_workers else 0) as threads, \
            closing(board.windows(order, window, lambda p: part_done(out, p, fps[p.name]), tally)) as windows:
        for claimed in windows:
            if not loaded:
                detector.to(job.device or task_device())
                bar = progress(desc=f"score task {task_index}/{num_tasks}", unit="sent",
                               disable=not job.show_progress)
                loaded = True

            def written(name: str, stats: dict) -> None:
                board.finish(name, claimed.pop(name)[1])
                run["parts_scored"] += 1
                run["sentences"] += stats["sentences"]
                bar.set_postfix(parts_scored=run["parts_scored"], parts=len(parts))

            if use_workers:
                score_parts_in_workers(detector, [p for p, _ in claimed.values()], out, unit, batch_size,
                                       decode_workers, bar, task_index, num_tasks, fps, guard, on_part=written)
            else:
                (p, _), = claimed.values()
                written(p.name, score_part(detector, p, out / p.name, unit, batch_size, bar, task_index,
                                           num_tasks, fingerprints=fps[p.name], guard=guard))
    if bar is not None:
        bar.close()
    run.update(end=time.time(), parts_taken_over=board.taken_over,
               scoring_time_s=round(time.perf_counter() - ts, 3), decode_workers=decode_workers if use_workers else 0,
               torch_threads=threads)
    tasks_dir = out / TASKS
    tasks_dir.mkdir(exist_ok=True)
    write_json_atomic(tasks_dir / f"{name}.{HOST}.{os.getpid()}.json", run)
    missing = [p.name for p in parts if not part_done(out, p, fps[p.name])]
    run["complete"] = not missing
    run["parts_missing"] = len(missing)
    run["held_by_live_tasks"] = board.held(missing)
    if not missing:
        finish_task_manifest(out, ident, parts, time.perf_counter() - t0, num_tasks, resumed, job.max_parse_failures,
                             extra={"decode_workers": run["decode_workers"], "torch_threads": threads})
    return run


def finish_task_manifest(out: Path, ident: dict, parts: list[Part], wall: float, num_tasks: int,
                         resumed: int = 0, max_parse_failures: float = DEFAULT_MAX_PARSE_FAILURES,
                         extra: dict | None = None) -> dict:
    """The complete manifest: the parts' own stats (:func:`parts.finish_manifest`) plus every task run's.
    ``parts_resumed`` counts the parts that existed when the finishing task started; ``extra``: the finishing
    task's ``decode_workers`` and ``torch_threads``."""
    runs = [json.loads(p.read_text()) for p in sorted((out / TASKS).glob("task-*.json"))]
    scored = sum(r["sentences"] for r in runs)
    span = (max(r["end"] for r in runs) - min(r["start"] for r in runs)) if runs else wall
    m = finish_manifest(out, ident, parts, wall, scored, resumed, num_tasks, t_scoring=span,
                         max_parse_failures=max_parse_failures, extra=extra)
    m.update(engine="tasks", num_tasks=num_tasks, task_runs=len(runs),
             parts_taken_over=sum(r.get("parts_taken_over", 0) for r in runs),
             tasks={f"{r['task_index']}@{r['host']}:{r['pid']}": {k: r[k] for k in (
                 "parts_scored", "sentences", "scoring_time_s", "parts_taken_over")} for r in runs})
    write_json_atomic(out / MANIFEST, m)
    return m
