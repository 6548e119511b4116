"""``halsift launch --gpus N -- run RECIPE``: the score stage on every rank, every other stage on rank 0 alone.

Rank 0 runs the recipe as one process would, except that

- at the start it writes ``<run>/_ranks/<launch>.json``: the stages it will skip (complete, same inputs, not
  forced), so that the other ranks take the same decisions without reading a folder rank 0 is changing;
- every stage but score runs with the launcher's rank variables hidden (:func:`solo`): accelerate, the trainers
  and the score runner see one process and never wait on the other ranks;
- its ``_done.json`` records ``launch`` (this launch's id); on a failure it writes ``<run>/_ranks/<launch>.failed``.

The other ranks wait for each stage before score by polling its ``_done.json`` for this launch's id (no process
group, so no NCCL/gloo timeout however long pretraining takes; ``HALSIFT_DIST_TIMEOUT`` seconds at most, default
24 h, and at once when rank 0 has failed), then score their share of the parts with rank 0 (the runner splits the
parts by rank and joins at its own barriers), then exit 0. After score rank 0 leaves the process group and runs
the rest alone.

The launch id is ``HALSIFT_LAUNCH_ID`` (``halsift launch`` and its sbatch scripts set it), else torchrun's
``TORCHELASTIC_RUN_ID`` when it is not ``none``; with the restart count appended, so a restarted launch never
reads the last attempt's records.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from halsift.corpus.config import ConfigError
from halsift.corpus.shards import write_json_atomic

RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
             "ROLE_WORLD_SIZE")
DEFAULT_WAIT_S = 24 * 3600.0
POLL_S = 1.0


class RankWaitError(RuntimeError):
    """A rank > 0 gave up waiting for rank 0 (rank 0 failed, or took longer than ``HALSIFT_DIST_TIMEOUT``)."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in a multi-process ``halsift run``."""

    rank: int
    world: int
    launch: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def launch_id(env: dict | None = None) -> str | None:
    env = os.environ if env is None else env
    base = env.get("HALSIFT_LAUNCH_ID") or (env.get("TORCHELASTIC_RUN_ID", "none") if env.get(
        "TORCHELASTIC_RUN_ID", "none") != "none" else None)
    return f"{base}.{env.get('TORCHELASTIC_RESTART_COUNT', '0')}" if base else None


def ranks_from_env(env: dict | None = None) -> Ranks | None:
    """This launch's ranks, or ``None`` for a single process (``WORLD_SIZE`` unset or 1)."""
    env = os.environ if env is None else env
    world = int(env.get("WORLD_SIZE", "1") or 1)
    if world <= 1:
        return None
    lid = launch_id(env)
    if lid is None:
        raise ConfigError(f"halsift run on {world} processes: no launch id; start it with `halsift launch --gpus N "
                          "-- run ...` or set HALSIFT_LAUNCH_ID to a value unique to this launch on every rank")
    return Ranks(int(env.get("RANK", "0") or 0), world, lid.replace("/", "_"))


def wait_timeout(env: dict | None = None) -> float:
    """How long a rank > 0 waits for one of rank 0's stages: ``HALSIFT_DIST_TIMEOUT`` seconds, default 24 h."""
    from halsift.execution.claims import dist_timeout_kwargs

    kw = dist_timeout_kwargs(env)
    return kw["timeout"].total_seconds() if kw else DEFAULT_WAIT_S


@contextmanager
def solo() -> Iterator[None]:
    """Run the block as a single process: the launcher's rank variables hidden, accelerate's state reset."""
    saved = {k: os.environ.pop(k) for k in RANK_VARS if k in os.environ}
    _reset_accelerate()
    try:
        yield
    finally:
        _reset_accelerate()
        os.environ.update(saved)


def leave_group() -> None:
    """After the score stage: end the process group this rank joined, so that what follows runs alone."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    _reset_accelerate()


def _reset_accelerate() -> None:
    try:
        from accelerate.state import AcceleratorState, PartialState
    except ImportError:  # accelerate not installed: nothing to reset
        return
    AcceleratorState._reset_state(reset_partial_state=True)
    PartialState._reset_state()


@contextmanager
def main_process_first(ranks: Ranks | None) -> Iterator[None]:
    """Inside the score stage: rank 0 runs the block first (e.g. writes a cached file), the others after it."""
    if ranks is None:
        yield
        return
    from halsift.execution.ranks import accelerate_state

    with accelerate_state(None).main_process_first():
        yield


# ------------------------------------------------------------------------------------------------ rank 0's records
def _ranks_dir(run: Path, make: bool = False) -> Path:
    d = run / "_ranks"
    if make:
        d.mkdir(parents=True, exist_ok=True)
    return d


def write_plan(run: Path, ranks: Ranks, skipped: list[str]) -> None:
    """Rank 0, before its first stage: the stages it skips in this launch."""
    write_json_atomic(_ranks_dir(run, make=True) / f"{ranks.launch}.json",
                      {"launch": ranks.launch, "world": ranks.world, "skipped": skipped})


def write_failure(run: Path, ranks: Ranks, stage: str, error: BaseException) -> None:
    """Rank 0, when a stage raised: the other ranks stop waiting at once."""
    write_json_atomic(_ranks_dir(run, make=True) / f"{ranks.launch}.failed",
                      {"stage": stage, "error": str(error)[:500]})


def _check_failed(run: Path, ranks: Ranks) -> None:
    f = _ranks_dir(run) / f"{ranks.launch}.failed"
    if f.exists():
        info = json.loads(f.read_text())
        raise RankWaitError(f"rank {ranks.rank}: rank 0 failed at stage {info['stage']} ({info['error']}); see its "
                            "log")


def _poll(what: str, ready: Callable[[], dict | None], run: Path, ranks: Ranks, timeout: float,
          poll: float) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = ready()
        if found is not None:
            return found
        _check_failed(run, ranks)
        if time.monotonic() > deadline:
            raise RankWaitError(f"rank {ranks.rank}: waited {timeout:.0f} s for {what} (launch {ranks.launch}); "
                                "rank 0 may be stuck or gone (raise HALSIFT_DIST_TIMEOUT for longer stages)")
        time.sleep(poll)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def read_plan(run: Path, ranks: Ranks, timeout: float, poll: float = POLL_S) -> dict:
    path = _ranks_dir(run) / f"{ranks.launch}.json"
    return _poll(f"rank 0's plan {path}", lambda: _read(path), run, ranks, timeout, poll)


def wait_for_stage(run: Path, stage_dir: Path, ranks: Ranks, fingerprint: str, timeout: float,
                   poll: float = POLL_S) -> dict:
    """Rank > 0: block until rank 0 has completed ``stage_dir`` in this launch (its ``_done.json``)."""
    from halsift.launch.stage_marker import stage_record

    def ready() -> dict | None:
        done = stage_record(stage_dir)
        ok = done is not None and done.get("launch") == ranks.launch and done.get("inputs", {}).get(
            "fingerprint") == fingerprint
        return done if ok else None

    return _poll(f"{stage_dir / '_done.json'}", ready, run, ranks, timeout, poll)


def follow(run: Path, ranks: Ranks, stages: list[str], stage_dirs: dict[str, Path], fingerprints: dict[str, str],
           shared: str, run_shared: Callable[[], object]) -> None:
    """What a rank > 0 does in ``halsift run``: wait for rank 0's stages up to ``shared`` (the stage that runs on
    every rank: score), run its share (``run_shared``), return."""
    if shared not in stages:
        print(f"[halsift run] rank {ranks.rank}: no {shared} stage; rank 0 runs the recipe", flush=True)
        return
    timeout = wait_timeout()
    plan = read_plan(run, ranks, timeout)
    for stage in stages[:stages.index(shared)]:
        if stage not in plan["skipped"]:
            print(f"[halsift run] rank {ranks.rank}: waiting for rank 0's {stage}", flush=True)
            wait_for_stage(run, stage_dirs[stage], ranks, fingerprints[stage], timeout)
    if shared in plan["skipped"]:
        print(f"[halsift run] rank {ranks.rank}: {shared} already complete; rank 0 runs the rest", flush=True)
        return
    started = time.time()
    run_shared()
    leave_group()
    print(f"[halsift run] rank {ranks.rank}: {shared} done in {time.time() - started:.1f}s; rank 0 runs the rest",
          flush=True)


@contextmanager
def stage_scope(ranks: Ranks | None, every_rank: bool) -> Iterator[None]:
    """Rank 0 around one stage: an ``every_rank`` stage (score) with every rank (then leave the group), any other
    stage alone."""
    if ranks is None:
        yield
    elif every_rank:
        try:
            yield
        finally:
            leave_group()
    else:
        with solo():
            yield
