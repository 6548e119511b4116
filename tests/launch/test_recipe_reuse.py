"""A recipe change costs only what it changes (issue 50): on a tiny world, one more detector in ``score.detectors``
scores only that detector (the others' parts, selections and fine-tuning runs are reused as they are: same inode,
same mtime, counted as reused by the engine); a changed ``score.batch_size`` re-scores nothing, in the recipe and in
``halsift score``; a changed ``dedup.cosine`` re-runs only dedup's global step (its per-shard parts and the
decontaminated corpus copy stay, and so does everything scored from it)."""

from __future__ import annotations

import json

from file_ids import file_id, file_ids

from halsift.launch.cli import main

BASE = ["world.images=60", "world.bench_images=12", "world.pretrain_images=60", "world.retrieval_images=20",
        "world.leaks=0.2", "world.exact_copies=2", "pretrain.steps=3", "pretrain.batch_size=16", "finetune.steps=2",
        "finetune.batch_size=16", "finetune.seeds=[0]", "score.batch_size=32", "wandb.mode=disabled"]
DETECTORS = {"clip": "clip:arch={arch},checkpoint={base}", "random": "random:seed=0", "oracle": "oracle"}
MORE = "score.detectors.random1=random:seed=1"


def _recipe(tmp_path):
    """The quickstart without trained detectors, ensembles, variants and extra evaluations (the reuse rules are the
    same for every detector; training them only costs time)."""
    import yaml

    from halsift.launch.cmd_run import shipped_recipes

    r = yaml.safe_load(shipped_recipes()["quickstart"].read_text())
    r.pop("detectors")
    r.pop("evals")
    r["score"] = {"detectors": DETECTORS}
    r["select"].pop("variants", None)
    r["stages"] = ["world", "pretrain", "dedup", "score", "select", "finetune", "eval", "report"]
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(r))
    return str(path)


def _manifest(folder) -> dict:
    return json.loads((folder / "_manifest.json").read_text())


def _state(run) -> dict:
    """Every file a later run must leave as it is: score parts and records, selections' shards, fine-tuned weights,
    dedup's per-shard parts and the decontaminated corpus."""
    out = {}
    for det in ("clip", "random", "oracle"):
        for what in ("corpus", "bench"):
            out[f"score/{det}/{what}"] = file_ids(run / "score" / det / what)
        out[f"select/{det}"] = file_ids(run / "select" / det, "*.tar", records=False)
        out[f"finetune/{det}"] = file_id(run / "finetune" / det / "seed0" / "final" / "open_clip_model.safetensors")
    out["dedup/_parts"] = file_ids(run / "dedup" / "_parts", "*.parquet", records=False)
    out["dedup/corpus"] = file_ids(run / "dedup" / "corpus", "*.tar")
    return out


def test_a_recipe_change_costs_only_what_it_changes(tmp_path, capsys):
    run = tmp_path / "run"
    common = ["run", _recipe(tmp_path), f"run_dir={run}", *BASE]
    assert main(common) == 0
    before = _state(run)
    assert all(before.values()), {k: v for k, v in before.items() if not v}

    # one more detector: only it is scored, selected and fine-tuned
    capsys.readouterr()
    assert main([*common, MORE]) == 0
    out = capsys.readouterr().out
    assert "score: score changed since it ran; re-running" in out
    assert _state(run) == before
    for det in ("clip", "random", "oracle"):
        m = _manifest(run / "score" / det / "corpus")
        assert m["parts_resumed"] == m["parts"] > 0 and m["sentences_scored_this_run"] == 0, det
    new = _manifest(run / "score" / "random1" / "corpus")
    assert new["parts_resumed"] == 0 and new["sentences_scored_this_run"] == new["sentences"] > 0
    assert (run / "finetune" / "random1" / "seed0" / "final" / "open_clip_model.safetensors").exists()
    metrics = json.loads((run / "report" / "metrics.json").read_text())
    assert "random1/r@5" in metrics and "clip/r@5" in metrics

    # batch size is run-only: the recipe skips the score stage, and halsift score reuses every part
    after_more = _state(run)
    capsys.readouterr()
    assert main([*common, MORE, "score.batch_size=7"]) == 0
    out = capsys.readouterr().out
    assert out.count("already complete, skipped") == 8 and _state(run) == after_more
    corpus = run / "dedup" / "corpus"
    clip_spec = _manifest(run / "score" / "clip" / "corpus")["detector"]
    assert main(["score", "--detector", clip_spec, "--data", str(corpus), "--out", str(run / "score" / "clip" /
                 "corpus"), "--batch-size", "5", "--no-progress"]) == 0
    assert _state(run) == after_more and _manifest(run / "score" / "clip" / "corpus")["sentences_scored_this_run"] == 0

    # dedup.cosine: dedup's global step runs again; its parts, the corpus copy and everything after are reused
    capsys.readouterr()
    assert main([*common, MORE, "dedup.cosine=0.9"]) == 0
    out = capsys.readouterr().out
    assert "dedup: dedup changed since it ran; re-running" in out
    dedup = json.loads((run / "dedup" / "manifest.json").read_text())
    assert dedup["shards_reused"] == dedup["shards"] > 0 and dedup["thresholds"]["cosine"] is None  # no model: unused
    assert _state(run) == after_more
    assert all(_manifest(run / "score" / d / "corpus")["sentences_scored_this_run"] == 0
               for d in ("clip", "random", "oracle", "random1"))


def _scores(folder) -> list:
    import pyarrow.parquet as pq

    rows = []
    for f in sorted(folder.glob("part-*.parquet")):
        rows += zip(*pq.read_table(f, columns=["key", "sentence_index", "score"]).to_pydict().values())
    return sorted(rows)


def test_a_stage_is_complete_while_its_folder_and_what_it_was_made_from_hold(tmp_path, capsys):
    """The runner skips a stage only while its fingerprint matches, its folder holds what it left there and it was
    made from what the stage before it holds now: a ``touch`` (times, not contents) skips everything; scores remade by
    hand with another detector are mended by the score stage (its records decide), and select, finetune, eval and
    report run again, reusing what holds (the same selections and fine-tuned weights, file for file)."""
    import os
    import shutil

    run = tmp_path / "run"
    common = ["run", _recipe(tmp_path), f"run_dir={run}", *BASE]
    assert main(common) == 0
    stages = ["world", "pretrain", "dedup", "score", "select", "finetune", "eval", "report"]
    corpus = run / "score" / "random" / "corpus"
    scores, before = _scores(corpus), _state(run)

    part = sorted(corpus.glob("part-*.parquet"))[0]  # a touch: times change, contents do not
    st = part.stat()
    os.utime(part, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    marker = json.loads((run / "score" / "_done.json").read_text())["outputs"]
    capsys.readouterr()
    assert main(common) == 0
    out = capsys.readouterr().out
    assert all(f"{s}: already complete, skipped" in out for s in stages), out
    now = json.loads((run / "score" / "_done.json").read_text())["outputs"]
    assert now["content"] == marker["content"] and now["stat"] != marker["stat"]  # the next check is cheap again

    shutil.rmtree(corpus)  # remade by hand with another detector (what a stage marker alone never saw)
    assert main(["score", "--detector", "random:seed=5", "--data", str(run / "dedup" / "corpus"), "--out",
                 str(corpus), "--no-progress"]) == 0
    assert _scores(corpus) != scores
    capsys.readouterr()
    assert main(common) == 0
    out = capsys.readouterr().out
    assert "world: already complete" in out and "dedup: already complete" in out
    assert f"score: {run / 'score'} changed since it completed; re-running" in out
    for s in ("select", "finetune"):
        assert f"{s}: score runs again; re-running (what still holds by its own identity is reused)" in out
    for s in ("eval", "report"):
        assert f"{s}: score runs again; clearing" in out
    assert _scores(corpus) == scores  # the recipe's own detector's scores again
    after = _state(run)
    assert after.pop("score/random/corpus") != before.pop("score/random/corpus")  # scored again, the same numbers
    assert after == before  # every selection and fine-tuned weight reused
    capsys.readouterr()
    assert main(common) == 0
    assert capsys.readouterr().out.count("already complete, skipped") == len(stages)

    # select made again alone (`stages=[select]`: it reads dedup's corpus copy, made by an earlier run) records what
    # score holds, so the next whole run skips it; the stages after it run again (its manifests record new timings)
    # and reuse every fine-tuning run
    assert main([*common, "stages=[select]", "--force", "select"]) == 0
    assert json.loads((run / "select" / "_done.json").read_text())["made_from"] == \
        json.loads((run / "score" / "_done.json").read_text())["outputs"]["content"]
    capsys.readouterr()
    assert main(common) == 0
    out = capsys.readouterr().out
    assert all(f"{s}: already complete, skipped" in out for s in stages[:5])
    kept = _state(run)
    assert {k: v for k, v in kept.items() if k in after and not k.startswith("select/")} == \
        {k: v for k, v in after.items() if not k.startswith("select/")}
