"""Does filtering pay? Fine-tune a pre-trained tiny CLIP on the oracle-filtered corpus vs a random subset.

    python benchmarks/oracle_vs_random.py --out /tmp/ovr            # CPU, ~10 minutes on 2 cores

Synthetic world (``halsift synth``) -> base model pre-trained on ``pretrain/`` -> ``score oracle`` on the
corpus -> ``select --keep K --unit caption --agg min`` (oracle) and ``--random --seed S`` (same size) -> fine-tune
the base on each with training seed S -> retrieval R@5 on ``retrieval/``. Prints one row per seed and the
means. Every stage is the ``halsift`` CLI (called in-process), so this is also an end-to-end smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path


def _cli(*argv: str) -> None:
    from halsift.launch.cli import main

    rc = main([str(a) for a in argv])
    if rc != 0:
        raise SystemExit(f"halsift {' '.join(map(str, argv[:2]))} failed with exit code {rc}")


def _final(run: Path) -> dict:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if "i2t/r@5" in x][-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--images", type=int, default=2000, help="corpus pairs in the synthetic world")
    ap.add_argument("--keep", type=float, default=0.4, help="fraction of captions kept by both selections")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--pretrain-steps", type=int, default=150)
    ap.add_argument("--steps", type=int, default=150, help="fine-tuning steps")
    ap.add_argument("--batch-size", type=int, default=64)
    args = ap.parse_args(argv)
    os.environ.setdefault("HALSIFT_QUIET", "1")
    out = Path(args.out)
    world = out / "world"
    if not (world / "world.json").exists():
        _cli("synth", "--out", world, "--images", args.images, "--seed", 0)
    common = ["--batch-size", args.batch_size, "--workers", 1, "--wandb-mode", "disabled",
              "--retrieval", world / "retrieval"]
    base = out / "base"
    if not (base / "final").exists():
        _cli("train", "clip", "--data", world / "pretrain", "--out", base, "--steps", args.pretrain_steps,
             "--lr", 5e-4, "--warmup", 10, *common)
    weights = base / "final" / "open_clip_model.safetensors"
    if not (out / "scores" / "_manifest.json").exists():
        _cli("score", "--detector", "oracle", "--data", world / "corpus", "--out", out / "scores", "--no-progress")
    sel = ["--scores", out / "scores", "--data", world / "corpus", "--keep", args.keep, "--unit", "caption",
           "--agg", "min", "--no-progress"]
    if not (out / "sel_oracle").exists():
        _cli("select", *sel, "--out", out / "sel_oracle")
    rows = []
    for s in args.seeds:
        if not (out / f"sel_random{s}").exists():
            _cli("select", *sel, "--out", out / f"sel_random{s}", "--random", "--seed", s)
        res = {}
        for name, data in (("oracle", out / "sel_oracle"), ("random", out / f"sel_random{s}")):
            run = out / f"ft_{name}_s{s}"
            if not (run / "final").exists():
                _cli("train", "clip", "--data", data, "--out", run, "--pretrained", weights, "--steps", args.steps,
                     "--lr", 1e-4, "--warmup", 5, "--seed", s, *common)
            res[name] = _final(run)
        rows.append(res)
        print(f"seed {s}: i2t R@5 oracle {res['oracle']['i2t/r@5']:.1f} vs random {res['random']['i2t/r@5']:.1f}; "
              f"t2i R@5 oracle {res['oracle']['t2i/r@5']:.1f} vs random {res['random']['t2i/r@5']:.1f}")
    b = _final(base)
    print(f"base: i2t R@5 {b['i2t/r@5']:.1f}, t2i R@5 {b['t2i/r@5']:.1f}")
    for d in ("i2t", "t2i"):
        o = statistics.mean(r["oracle"][f"{d}/r@5"] for r in rows)
        r_ = statistics.mean(r["random"][f"{d}/r@5"] for r in rows)
        wins = sum(r["oracle"][f"{d}/r@5"] > r["random"][f"{d}/r@5"] for r in rows)
        print(f"mean {d} R@5: oracle {o:.2f} vs random {r_:.2f} (oracle better in {wins}/{len(rows)} seeds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
