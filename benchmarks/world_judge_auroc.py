"""Build the synthetic world's VLM judge and print its bench AUROC (val, test) with CPU and wall seconds.

    python benchmarks/world_judge_auroc.py --seeds 0 1 --threads 2 [--images 1200] [--set image_size=48 ...]
    python benchmarks/world_judge_auroc.py --seeds 0 1 --threads 1 --work W --clip  # CLIP vision tower
    python benchmarks/world_judge_auroc.py --seeds 0 --threads 1 --work W --clip --shuffled  # + shuffled images

``--components`` also scores the two members of the default judge (the yes/no LoRA judge, the captioner's image
PMI) on their own. ``--clip`` first pre-trains a halsift-tiny CLIP on the world's ``pretrain/`` as the quickstart does (cached under
``--work``; its time is not in build_cpu_s) and passes it as ``vision_from``. ``--shuffled`` also scores the test
split with each row's image swapped for another image (a judge that uses the image drops clearly).

The world is generated once under ``--work`` (default a temporary folder); each seed builds its judge afresh.
Prints numbers only: it never passes or fails on them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from pathlib import Path

import torch


def test_auroc(spec: str, bench: Path, shuffled: bool = False) -> tuple[float, float]:
    """(pooled AUROC, mean of per-generator AUROCs) of ``spec`` on the bench test split (the slow test asserts the
    pooled one; the seeds report the per-generator mean); ``shuffled``: each test image replaced by another test
    image (a fixed derangement of the distinct images)."""
    from halsift.corpus.bench import read_bench, with_shuffled_images, write_bench
    from halsift.eval.runs.bench_eval import bench_frame, join_scores
    from halsift.eval.metrics.detection import auroc, labelled
    from halsift.filtering.scoring.runner import score_bench
    from halsift.filtering.detectors.spec import load_detector

    rows = [r for r in read_bench(bench) if r.split == "test"]
    test = bench.with_name("bench_test.jsonl")
    if shuffled:
        rows = with_shuffled_images(rows)
        test = bench.with_name("bench_test_shuffled.jsonl")
    write_bench(test, rows)
    det = load_detector(spec)
    df, _, _ = join_scores(bench_frame(test), score_bench(det, test, show_progress=False), det.name)
    df = labelled(df)
    per_gen = [auroc(g.label, g.score) for _, g in df.groupby("generator") if g.label.nunique() == 2]
    return float(auroc(df.label, df.score)), float(sum(per_gen) / len(per_gen))


def clip_weights(world: Path, out: Path) -> Path:
    """A halsift-tiny CLIP pre-trained on ``world/pretrain`` the way the quickstart does (cached in ``out``)."""
    from halsift.training.clip_config import ClipTrainConfig
    from halsift.training.clip_train import train

    weights = out / "final" / "open_clip_model.safetensors"
    if not weights.exists():
        c0, w0 = time.process_time(), time.perf_counter()
        train(ClipTrainConfig(data=[str(world / "pretrain")], out=str(out), model="halsift-tiny", steps=400,
                              batch_size=64, lr=1e-3, warmup=40, wandb_mode="disabled", seed=0, workers=0))
        print(json.dumps({"clip_pretrain_cpu_s": round(time.process_time() - c0, 1),
                          "clip_pretrain_wall_s": round(time.perf_counter() - w0, 1)}), flush=True)
    return weights


def main(argv: list[str] | None = None) -> None:
    from halsift.synth.world import generate_world
    from halsift.synth.world_judge import WorldJudgeSettings, build_world_judge

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=1200)
    ap.add_argument("--pretrain-images", type=int, default=6000, help="the world's clean pre-training pairs")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--work", default="")
    ap.add_argument("--set", nargs="*", default=[], help="WorldJudgeSettings overrides, key=value")
    ap.add_argument("--clip", action="store_true", help="pre-train a halsift-tiny CLIP on pretrain/ (cached) and "
                    "use it as vision_from")
    ap.add_argument("--shuffled", action="store_true", help="also report the test AUROC with shuffled images")
    ap.add_argument("--components", action="store_true", help="also report each member of an ensemble judge")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    work = Path(args.work or tempfile.mkdtemp(prefix="world_judge_"))
    world = work / f"world{args.images}-p{args.pretrain_images}"
    if not (world / "world.json").exists():
        generate_world(world, images=args.images, seed=0, pretrain_images=args.pretrain_images)
    fields = {f.name: f.type for f in dataclasses.fields(WorldJudgeSettings)}
    kw = {}
    for kv in args.set:
        k, v = kv.split("=", 1)
        kind = type(getattr(WorldJudgeSettings(), k)) if k in fields else str
        kw[k] = v.lower() in ("1", "true", "yes") if kind is bool else kind(v)
    if args.clip:
        kw["vision_from"] = str(clip_weights(world, work / f"clip{args.images}-p{args.pretrain_images}"))
    settings = WorldJudgeSettings(**kw)
    for seed in args.seeds:
        out = work / f"judge-s{seed}-{time.time_ns()}"
        c0, w0 = time.process_time(), time.perf_counter()
        spec = build_world_judge(world, out, seed=seed, settings=settings)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        rec = json.loads((out / "judge.json").read_text())
        auc, auc_gen = test_auroc(spec, world / "bench" / "bench.jsonl")
        extra = {}
        if args.shuffled:
            sh, sh_gen = test_auroc(spec, world / "bench" / "bench.jsonl", True)
            extra = {"shuffled_test_auroc": round(sh, 2), "shuffled_test_auroc_gen_mean": round(sh_gen, 2)}
        if args.components and spec.startswith("ensemble:"):
            from halsift.synth.world_judge import world_judge_spec

            pmi = world_judge_spec(out, settings).split(";", 1)[1].rsplit("],", 1)[0]
            for name, member in (("judge", f"lora:{out / 'judge' / 'adapter'}"), ("pmi", pmi)):
                extra[f"{name}_test_auroc"], extra[f"{name}_test_auroc_gen_mean"] = (
                    round(x, 2) for x in test_auroc(member, world / "bench" / "bench.jsonl"))
        print(json.dumps({"seed": seed, "images": args.images, "threads": args.threads, "settings": kw,
                          "test_auroc": round(auc, 2), "test_auroc_gen_mean": round(auc_gen, 2), **extra,
                          "val_auroc": round(rec["judge"]["val/auroc"], 2),
                          "best_step": rec["judge"].get("best_step"),
                          "pretrain_cpu_s": round(rec["pretrain"]["cpu_seconds"], 1),
                          "pretrain_loss": [round(rec["pretrain"]["loss_first"], 3),
                                            round(rec["pretrain"]["loss_last"], 3)],
                          "build_cpu_s": round(cpu, 1), "build_wall_s": round(wall, 1)}), flush=True)


if __name__ == "__main__":
    main()
