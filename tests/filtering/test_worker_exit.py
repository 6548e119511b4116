"""Worker processes end with their parent: SIGKILL of ``halsift score --decode-workers 1`` takes the decode worker
with it (it used to stay, blocked on a full pipe, ~0.5 GB, for good), and both ways of
:mod:`halsift.corpus.parent_watch` (Linux's parent-death signal, the polling thread) end a child whose parent died."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filtering_data import make_corpus

ENV = {**os.environ, "HALSIFT_QUIET": "1", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")])}


def children(pid: int) -> list[int]:
    """The child pids of ``pid`` (psutil where installed, else /proc)."""
    try:
        import psutil
    except ImportError:
        found = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            found += [int(c) for c in (task / "children").read_text().split()]
        return found
    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.NoSuchProcess:
        return []


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (an orphan's zombie waits for init, which may not reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not running(pid):
            return True
        time.sleep(0.1)
    return not running(pid)


def wait_for_child(proc: subprocess.Popen, seconds: float = 120) -> int:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        kids = children(proc.pid)
        if kids:
            return kids[0]
        time.sleep(0.1)
    proc.kill()
    pytest.fail(f"no child process appeared: {proc.communicate()[1][-2000:] if proc.stderr else ''}")


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_sigkill_of_score_takes_its_decode_worker_with_it(tmp_path):
    """A slow model (``delay``) and batches larger than a pipe: at the kill the worker has batches the dead main
    process will never read. Before: alive after 60 s. After: gone within seconds."""
    data = make_corpus(tmp_path / "c", shards=2, per_shard=40, seed=1)
    cmd = [sys.executable, "-m", "halsift.launch.cli", "score", "--detector", "clip:arch=halsift-tiny,pretrained=random,seed=0,delay=0.5",
           "--data", str(data), "--out", str(tmp_path / "out"), "--batch-size", "16", "--decode-workers", "1",
           "--no-progress"]
    proc = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    worker = wait_for_child(proc)
    try:
        time.sleep(2)  # the worker decodes and sends ahead of the model
        assert running(worker) and proc.poll() is None
        _kill_parent(proc, worker, 5, f"decode worker {worker}")
    finally:
        _reap(worker)
        proc.stderr.close()


def _kill_parent(proc: subprocess.Popen, child: int, within: float, what: str) -> None:
    """SIGKILL the parent ``proc``; ``child`` must be gone ``within`` seconds."""
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert gone_within(child, within), f"{what} outlived its killed parent"


def _reap(pid: int) -> None:
    if running(pid):
        os.kill(pid, signal.SIGKILL)


PARENT = """
import multiprocessing as mp, sys, time
from halsift.corpus.parent_watch import exit_with_parent

def child(parent, use_prctl):
    exit_with_parent(parent, use_prctl=use_prctl, poll_s=0.1)
    time.sleep(120)

if __name__ == "__main__":
    import os
    p = mp.get_context(sys.argv[1]).Process(target=child, args=(os.getpid(), sys.argv[2] == "prctl"))
    p.start()
    print(p.pid, flush=True)
    time.sleep(120)
"""


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("how", ["prctl", "poll"])
@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_child_ends_when_its_parent_is_killed(tmp_path, how, start):
    script = tmp_path / "parent.py"
    script.write_text(PARENT)
    proc = subprocess.Popen([sys.executable, str(script), start, how], env=ENV, stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    try:
        time.sleep(1.5 if start == "spawn" else 0.3)  # the child is past exit_with_parent
        assert running(child)
        _kill_parent(proc, child, 3, f"child {child} ({how}, {start})")
    finally:
        _reap(child)
        proc.stdout.close()


def test_a_child_whose_parent_is_already_gone_exits_at_once():
    """The parent died before the child asked to be told (its parent pid is no longer the one it was given)."""
    code = "from halsift.corpus.parent_watch import exit_with_parent; exit_with_parent(1); print('still here')"
    proc = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "still here" not in proc.stdout


def test_the_training_loader_installs_the_parent_watch(monkeypatch, tmp_path):
    """``train clip``'s DataLoader gets the watch as its worker_init_fn, as the score workers' does."""
    import torch.utils.data

    from halsift.corpus.parent_watch import ExitWithParent
    from halsift.training.clip_data import make_loader

    seen = []
    real = torch.utils.data.DataLoader.__init__

    def spy(self, *a, **kw):
        seen.append(kw.get("worker_init_fn"))
        real(self, *a, **kw)

    monkeypatch.setattr(torch.utils.data.DataLoader, "__init__", spy)
    make_loader([str(make_corpus(tmp_path / "c", shards=1, per_shard=2))], lambda x: x, lambda x: x, batch_size=2,
                workers=1)
    assert len(seen) == 1 and isinstance(seen[0], ExitWithParent) and seen[0].parent_pid == os.getpid()
