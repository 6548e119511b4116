"""The execution layer's engines: a registry by name that ``--engine`` resolves, one typed job built from the
command's settings and handed whole to every engine, each engine honouring or refusing (one line) each flag."""

from __future__ import annotations

import dataclasses
import typing

import pytest
from filtering_data import make_corpus

from halsift.corpus.images import SkipCounter
from halsift.corpus.sample import read_shard, sample_items
from halsift.corpus.scores import read_scores_df
from halsift.execution.engines import ENGINES, Engine, EngineError, Summary, get_engine, resolve_engine, run_job
from halsift.execution.flags import EngineName
from halsift.filtering.scoring.job import ScoreJob
from halsift.filtering.scoring.job import job_of
from halsift.launch.cmd_score import ScoreConfig


def test_registry_names_are_the_engine_flag_choices():
    assert list(ENGINES) == ["local", "tasks", "ray"] == list(typing.get_args(EngineName))
    assert typing.get_type_hints(ScoreConfig)["engine"] == EngineName
    assert all(isinstance(e, Engine) and e.name == n for n, e in ENGINES.items())
    with pytest.raises(EngineError, match="--engine: expected one of local, tasks, ray, got 'spark'"):
        get_engine("spark")


def test_job_carries_every_scoring_setting_of_score_config():
    """Every ScoreConfig field reaches the job (under its name; ``no_progress`` as ``show_progress``), except the
    engine choice itself and the wandb logging, which stay in launch; the job's own extra fields are the two a
    pipeline sets on its stages (``role``, ``root``), never set from ``halsift score``."""
    cfg = ScoreConfig(detector="random:seed=0", data="d", out="o", unit="caption", batch_size=7, device="cpu",
                      no_progress=True, decode_workers=3, max_parse_failures=0.5, num_tasks=4, task_index=2,
                      claim_timeout=9.0, address="auto", workers=5, embeddings="emb", full_hash=True)
    job = job_of(cfg)
    cfg_names = {f.name for f in dataclasses.fields(ScoreConfig)} - {"engine", "wandb", "wandb_project",
                                                                      "no_progress"}
    pipeline_only = {"role", "root"}
    assert cfg_names | {"show_progress"} | pipeline_only == {f.name for f in dataclasses.fields(ScoreJob)}
    assert all(getattr(job, n) == getattr(cfg, n) for n in cfg_names) and job.show_progress is False
    assert job.role == "" and job.root == ""
    assert ScoreJob("s", "d", "o").given() == {"detector", "data", "out"}
    assert job.given() == {f.name for f in dataclasses.fields(ScoreJob)} - pipeline_only


@pytest.mark.parametrize("engine,setting,value,message", [
    ("local", "claim_timeout", 5.0, "--claim-timeout: only with --num-tasks (or in a SLURM array task)"),
    ("local", "workers", 2, "--address/--workers: only with --engine ray"),
    ("local", "address", "auto", "--address/--workers: only with --engine ray"),
    ("tasks", "workers", 2, "--address/--workers: only with --engine ray"),
    ("ray", "num_tasks", 2, "--engine ray: Ray deals the parts itself"),
    ("ray", "claim_timeout", 5.0, "--engine ray: Ray deals the parts itself"),
])
def test_each_engine_refuses_what_it_does_not_honour(engine, setting, value, message):
    job = dataclasses.replace(ScoreJob("random:seed=0", "d", "o"), **{setting: value})
    assert setting not in ENGINES[engine].flags
    with pytest.raises(EngineError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ENGINES[engine].check(job)


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_every_engine_hands_the_job_whole_to_open(engine, monkeypatch, tmp_path):
    """No engine rebuilds a job from some of its settings (the way a setting used to be lost): each opens the very
    job it was given, whatever its settings."""
    opened = []

    def record(self, place):
        opened.append((self, place))
        raise _Stop("reached")

    monkeypatch.setattr(ScoreJob, "open", record)
    if engine == "ray":
        monkeypatch.setattr("halsift.execution.engines.ray_module", lambda: object())
    job = ScoreJob("clip:arch=halsift-tiny,pretrained=random", str(tmp_path / "data"), str(tmp_path / "out"),
                   unit="caption", batch_size=7, device="cpu", decode_workers=5, max_parse_failures=0.37,
                   show_progress=False, embeddings=str(tmp_path / "emb"), full_hash=True,
                   **({"num_tasks": 3, "task_index": 1} if engine == "tasks" else {}))
    with pytest.raises(_Stop, match="^reached$"):
        ENGINES[engine].run(job)
    ((got, place),) = opened
    assert got is job
    assert (place.rank, place.world) == ((1, 3) if engine == "tasks" else (0, 1))


class _Stop(Exception):
    """Raised by the recorded open: the engine got that far with the job."""


def test_local_resolves_to_tasks_when_a_task_is_named_or_in_a_slurm_array():
    job = ScoreJob("random:seed=0", "d", "o")
    assert resolve_engine("local", job, env={}).name == "local"
    assert resolve_engine("local", dataclasses.replace(job, num_tasks=2), env={}).name == "tasks"
    assert resolve_engine("local", job, env={"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2"}).name == "tasks"
    assert resolve_engine("ray", job, env={}).name == "ray"
    with pytest.raises(EngineError, match="--engine tasks: give --num-tasks"):
        ENGINES["tasks"].run(job)


def test_local_and_task_engines_write_the_same_scores(tmp_path, monkeypatch):
    for k in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN"):
        monkeypatch.delenv(k, raising=False)
    data = make_corpus(tmp_path / "c", shards=3, per_shard=3, seed=2)
    base = ScoreJob("random:seed=0", data, tmp_path / "local", batch_size=4, show_progress=False)
    a = run_job(base)
    assert isinstance(a, Summary) and (a.engine, a.complete, a.report, a.lines) == ("local", True, True, [])
    runs = [run_job(dataclasses.replace(base, out=tmp_path / "tasks", num_tasks=2, task_index=i)) for i in (0, 1)]
    assert [r.engine for r in runs] == ["tasks", "tasks"] and [r.complete for r in runs] == [True, True]
    assert runs[0].run["parts_made"] == 3 and runs[1].run["parts_skipped_done"] == 3  # task 0 stole all
    assert runs[1].lines == ["task 1/2: scored 0 parts (0 items), 3 already done, 0 taken over from dead tasks"]
    cols = ["key", "sentence_index", "score"]
    want = read_scores_df(tmp_path / "local")[cols].sort_values(cols[:2]).reset_index(drop=True)
    got = read_scores_df(tmp_path / "tasks")[cols].sort_values(cols[:2]).reset_index(drop=True)
    skipped = SkipCounter()
    n = sum(len(sample_items(s)) 
            for shard in sorted(data.glob("*.tar")) for s in read_shard(shard, skipped))
    assert len(want) == n > 0 and want.equals(got)


def test_a_changed_input_remakes_exactly_its_part_on_every_engine(tmp_path, monkeypatch):
    """One shard's content changes: the rerun (local, or two tasks) makes that shard's part again and leaves every
    other part as it is (same inode and mtime, counted as found done). (The per-shard stages:
    tests/filtering/test_stage_engine.py.)"""
    import io
    import tarfile

    from file_ids import file_id

    for k in ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_MIN"):
        monkeypatch.delenv(k, raising=False)
    data = make_corpus(tmp_path / "c", shards=4, per_shard=4, seed=3)
    local = ScoreJob("random:seed=0", data, tmp_path / "local", batch_size=4, show_progress=False)
    tasks = [dataclasses.replace(local, out=tmp_path / "tasks", num_tasks=2, task_index=i) for i in (0, 1)]
    for job in (local, *tasks):
        run_job(job)
    ids = {d: {p.name: file_id(p) for p in (tmp_path / d).glob("part-*.parquet")} for d in ("local", "tasks")}
    shard = sorted(data.glob("*.tar"))[2]
    with tarfile.open(shard) as tar:  # one sample fewer: the shard's content changed
        members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
    with tarfile.open(shard, "w") as tar:
        for m, payload in members[:-3]:
            tar.addfile(m, io.BytesIO(payload))
    again = run_job(local)
    runs = [run_job(job) for job in tasks]
    changed = f"part-{shard.name.removesuffix('.tar')}.parquet"
    assert again.run["made"] == [changed] and again.run["parts_skipped_done"] == 3
    assert sorted(n for r in runs for n in r.run["made"]) == [changed]
    for d in ("local", "tasks"):
        now = {p.name: file_id(p) for p in (tmp_path / d).glob("part-*.parquet")}
        assert [n for n in now if now[n] != ids[d][n]] == [changed], d
    assert len(read_scores_df(tmp_path / "local")) == len(read_scores_df(tmp_path / "tasks")) > 0
