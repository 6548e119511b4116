"""A whole recipe, tiny: every stage runs, the report lists every filter, a rerun skips finished stages."""

from __future__ import annotations

import json

import pytest
from file_ids import file_id
from PIL import Image

from halsift.launch.cli import main

TINY = ["world.images=60", "world.bench_images=12", "world.pretrain_images=60", "world.retrieval_images=20",
        "world.leaks=0.2", "world.exact_copies=2", "pretrain.steps=3",
        "pretrain.batch_size=16", "finetune.steps=2", "finetune.batch_size=16", "finetune.seeds=[0]",
        "score.batch_size=32", "evals.ihalla={synthetic: true, prompts: 6}", "evals.vope={synthetic: true, images: 6}",
        "evals.vigil={synthetic: true, per_category: 4}", "wandb.mode=disabled",
        "detectors.judge.options={pretrain_steps: 2, pretrain_batch: 4, judge_steps: 2, judge_batch: 4, eval_every: 2, "
        "vision_from: '{base}', vision_arch: '{arch}', pmi_references: 2}",
        "detectors.clip-lora.options={steps: 2, batch_size: 16, eval_every: 2}",
        "select.variants={oracle@0.5: {filter: oracle, keep: 0.5}}"]


def _recall5(weights, retrieval) -> tuple[dict[str, float], dict[str, float]]:
    """i2t and t2i recall@5 (0-100) of halsift-tiny ``weights`` on a retrieval folder, computed here from scratch:
    an image is a hit when one of its captions is among the 5 captions most similar to it; a caption when its
    image is among the 5 images most similar to it."""
    import numpy as np
    import open_clip
    import torch

    from halsift.training.clip_config import ensure_model_configs

    from safetensors import safe_open

    ensure_model_configs()
    with safe_open(str(weights), framework="pt") as f:  # a SigLIP fine-tune stores the bias the arch lacks
        extra = {"init_logit_bias": 0.0} if "logit_bias" in f.keys() else {}
    model, _, preprocess = open_clip.create_model_and_transforms("halsift-tiny", pretrained=str(weights), **extra)
    model.eval()
    rows = [json.loads(x) for x in (retrieval / "retrieval.jsonl").read_text().splitlines()]
    owner = np.array([i for i, r in enumerate(rows) for _ in r["captions"]])
    with torch.no_grad():
        ims = torch.stack([preprocess(Image.open(retrieval / r["image"]).convert("RGB")) for r in rows])
        img = model.encode_image(ims, normalize=True).numpy()
        txt = model.encode_text(open_clip.get_tokenizer("halsift-tiny")(
            [c for r in rows for c in r["captions"]]), normalize=True).numpy()
    sim = img @ txt.T
    i2t = [(owner[t] == i).any() for i, t in enumerate(np.argsort(-sim, axis=1)[:, :5])]
    t2i = [owner[j] in t for j, t in enumerate(np.argsort(-sim.T, axis=1)[:, :5])]
    # queries whose hit or miss turns on float rounding: the own item's similarity within TIE of the 5th best
    # other one (the eval encodes with the text tower cut to the used positions, in float64, with torch's threads)
    near_i2t = sum(_near_cut(sim[i], owner == i) for i in range(len(rows)))
    near_t2i = sum(_near_cut(sim[:, j], np.arange(len(rows)) == owner[j]) for j in range(len(owner)))
    return {"i2t/r@5": 100 * float(np.mean(i2t)), "t2i/r@5": 100 * float(np.mean(t2i))}, \
        {"i2t/r@5": 100 * near_i2t / len(rows), "t2i/r@5": 100 * near_t2i / len(owner)}


TIE = 1e-4  # similarities this close are the same up to the two encoders' float rounding


def _near_cut(sims, own) -> bool:
    """Whether the best own item's similarity is within :data:`TIE` of the 5th best other item's."""
    import numpy as np

    others = np.sort(sims[~own])[::-1]
    return len(others) >= 5 and abs(float(sims[own].max()) - float(others[4])) < TIE


def _check_retrieval(run, names) -> None:
    """The report's R@5 of each model is its own checkpoint's (one seed): no-tune = the pre-trained base."""
    metrics = json.loads((run / "report" / "metrics.json").read_text())
    for name in names:
        weights = run / ("pretrain" if name == "no-tune" else f"finetune/{name}/seed0") / "final"
        want, slack = _recall5(weights / "open_clip_model.safetensors", run / "world" / "retrieval")
        got = {k: metrics[f"{name}/synthetic/{k}"] for k in want}
        assert all(abs(got[k] - want[k]) <= slack[k] + 1e-6 for k in want), (name, got, want, slack)


def test_quickstart_runs_end_to_end_and_resumes(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["run", "quickstart", f"run_dir={run}", *TINY]) == 0
    stages = ("world", "pretrain", "detectors", "dedup", "score", "select", "finetune", "eval", "report")
    for stage in stages:
        assert (run / stage / "_done.json").exists(), stage
    # the planted leaks and copies are removed before scoring, and the report says so
    world = json.loads((run / "world" / "world.json").read_text())
    dups = json.loads((run / "dedup" / "manifest.json").read_text())
    assert dups["samples"] == 66 and dups["counts"]["exact"] == 2 and dups["counts"]["eval"] >= 4
    from halsift.filtering.curation import excluded_keys

    removed = excluded_keys(run / "dedup")
    assert set(world["leaks"]) | set(world["exact_copies"]) <= removed
    import pyarrow.parquet as pq

    scored = {k for part in (run / "score" / "random" / "corpus").glob("part-*.parquet")
              for k in pq.read_table(part, columns=["key"]).column("key").to_pylist()}
    assert len(scored) == 66 - len(removed) and not removed & scored
    report_md = (run / "report" / "report.md").read_text()
    assert f"Before scoring, {len(removed)} of 66 corpus samples were removed" in report_md
    assert (run / "recipe.resolved.yaml").exists()
    filters = ["clip", "clip-lora", "judge", "random", "oracle", "judge+clip-lora"]
    for name, adapter in (("clip-lora", "clip-lora/adapter"), ("judge", "judge/judge/adapter")):
        assert (run / "detectors" / adapter / "detector.yaml").exists(), name
        manifest = json.loads((run / "score" / name / "corpus" / "_manifest.json").read_text())
        if name == "judge":  # the yes/no judge z-scored with its captioner's image PMI
            spec = manifest["detector"]
            assert spec.startswith("ensemble:") and "norm=zscore" in spec and "mode=pmi" in spec
            assert f"{run / 'detectors' / adapter}" in spec and f"{run / 'detectors' / 'judge' / 'references'}" in spec
        else:
            assert manifest["detector"].startswith("lora:") and manifest["detector"].endswith(adapter)
    judge = json.loads((run / "detectors" / "judge" / "judge.json").read_text())
    assert judge["settings"]["vision_from"] == str(run / "pretrain" / "final" / "open_clip_model.safetensors")
    for name in filters:
        assert (run / "score" / name / "corpus").exists() and (run / "score" / name / "bench").exists()
        manifest = json.loads((run / "select" / name / "manifest.json").read_text())
        assert manifest["kept_units"] > 0
        assert (run / "finetune" / name / "seed0" / "final" / "open_clip_model.safetensors").exists()
    oracle = json.loads((run / "select" / "oracle" / "manifest.json").read_text())
    assert oracle["precision"]["kept"] == 100.0
    # a selection variant reads the oracle's scores with its own keep, and is fine-tuned and reported like a filter
    wider = json.loads((run / "select" / "oracle@0.5" / "manifest.json").read_text())
    assert wider["kept_units"] > oracle["kept_units"] and not (run / "score" / "oracle@0.5").exists()
    assert (run / "finetune" / "oracle@0.5" / "seed0" / "final" / "open_clip_model.safetensors").exists()

    report = (run / "report" / "report.md").read_text()
    table = [line for line in report.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in table[1:len(filters) + 3]] == ["no-tune", *filters, "oracle@0.5"]
    assert "Best detector filter: `oracle@0.5`" not in report
    metrics = json.loads((run / "report" / "metrics.json").read_text())
    assert metrics["oracle/auroc/mean"] == 100.0 and metrics["oracle/kept_precision"] == 100.0
    _check_retrieval(run, ["no-tune", *filters])
    # zero-shot and compositional accuracy of every model, on the world's sets, in the report (issue 33)
    beyond = json.loads((run / "eval" / "beyond.json").read_text())
    assert set(beyond) == {"no-tune", *filters, "oracle@0.5"}
    measures = {"zeroshot/shape/acc1", "zeroshot/acc1", "compositional/swap_obj", "compositional/mean"}
    assert measures <= set(beyond["judge"][0])
    assert metrics["oracle/compositional/mean"] == beyond["oracle"][0]["compositional/mean"]
    assert "| zero-shot top-1 | compositional |" in report and (run / "report" / "gain_over_random.png").exists()
    for png in (run / "report").glob("*.png"):
        Image.open(png).verify()
    for extra in ("ihalla", "vope", "vigil"):
        assert (run / "eval" / extra / "metrics.json").exists() and f"{extra}: " in report

    marks = {s: file_id(run / s / "_done.json") for s in stages}
    capsys.readouterr()
    assert main(["run", "quickstart", f"run_dir={run}", *TINY]) == 0
    out = capsys.readouterr().out
    assert out.count("already complete, skipped") == 9
    assert ": running" not in out
    assert {s: file_id(run / s / "_done.json") for s in stages} == marks  # no stage ran again
    assert (run / "report" / "report.md").read_text() == report

    # a changed option re-runs its stage and the stages after it; the ones before are kept, and so is, inside the
    # re-run stages, what still holds by its own identity: the oracle@0.5 variant already kept half of the units, so
    # its selection and its fine-tuning run are reused; every other filter is selected and fine-tuned again
    before = json.loads((run / "select" / "random" / "manifest.json").read_text())["kept_units"]
    variant = run / "finetune" / "oracle@0.5" / "seed0" / "final" / "open_clip_model.safetensors"
    variant_stamp = (variant.stat().st_ino, variant.stat().st_mtime_ns)
    assert main(["run", "quickstart", f"run_dir={run}", *TINY, "select.keep=0.5"]) == 0
    out = capsys.readouterr().out
    assert out.count("already complete, skipped") == 5  # world, pretrain, detectors, dedup, score
    assert {s: file_id(run / s / "_done.json") for s in stages[:5]} == {s: marks[s] for s in stages[:5]}
    assert "select: select changed since it ran; re-running" in out
    assert "finetune: an earlier stage's inputs changed since it ran; re-running" in out  # neither is cleared
    for stage in ("finetune", "eval", "report"):
        assert f"{stage}: an earlier stage's inputs changed since it ran" in out
    emptied = [line.split(":")[0] for line in out.splitlines() if "emptying it and selecting again" in line]
    assert "[halsift run] select.random" in emptied and "[halsift run] select.oracle@0.5" not in emptied
    kept = json.loads((run / "select" / "random" / "manifest.json").read_text())["kept_units"]
    assert kept > before
    assert (variant.stat().st_ino, variant.stat().st_mtime_ns) == variant_stamp

    # fine-tuning runs went one per core, each in its own single-threaded process; one after another in this
    # process (finetune.jobs=1) they give the same weights
    import os

    import numpy as np
    from safetensors.numpy import load_file

    if (os.cpu_count() or 1) > 1:
        assert "finetune: 6 runs, 2 at a time (one thread each)" in out
    weights = {n: load_file(run / "finetune" / n / "seed0" / "final" / "open_clip_model.safetensors")
               for n in (*filters, "oracle@0.5")}
    assert main(["run", "quickstart", f"run_dir={run}", *TINY, "select.keep=0.5", "finetune.jobs=1", "--force",
                 "finetune"]) == 0
    out = capsys.readouterr().out
    assert "finetune: forced; clearing" in out and "at a time" not in out
    for name, before_w in weights.items():
        after = load_file(run / "finetune" / name / "seed0" / "final" / "open_clip_model.safetensors")
        assert after.keys() == before_w.keys()
        for k in after:
            np.testing.assert_allclose(after[k], before_w[k], rtol=1e-4, atol=1e-5, err_msg=f"{name}: {k}")


def test_siglip_pretrain_and_finetune_run_end_to_end(tmp_path):
    """``pretrain.loss=siglip finetune.loss=siglip``: the base and fine-tuned checkpoints store ``logit_bias``, and
    every loader (the clip detector on the base, the world judge's vision tower, fine-tuning, the eval) reads them."""
    run = tmp_path / "run"
    over = [f"run_dir={run}", *TINY, "pretrain.loss=siglip", "finetune.loss=siglip", "select.variants={}",
            "score.detectors={clip: 'clip:arch={arch},checkpoint={base}', judge: '{trained.judge}', "
            "clip-lora: '{trained.clip-lora}', random: 'random:seed=0', oracle: oracle}", "score.ensembles={}"]
    over = [o for o in over if not o.startswith("evals.")] + ["evals.ihalla=null", "evals.vope=null",
                                                              "evals.vigil=null"]
    assert main(["run", "quickstart", *over]) == 0
    from safetensors import safe_open

    with safe_open(str(run / "pretrain" / "final" / "open_clip_model.safetensors"), framework="pt") as f:
        assert "logit_bias" in f.keys()
    _check_retrieval(run, ("no-tune", "clip", "clip-lora", "judge", "random", "oracle"))
