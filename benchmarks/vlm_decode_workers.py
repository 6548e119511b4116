"""The ``vlm`` judge through the scoring runner with its CPU half (JPEG decode, ``max_pixels`` cap, the processor,
tokenization) in the read-ahead thread vs in ``--decode-workers N`` processes: sentences/s, the manifest's time
shares, and whether the scores are identical. A tiny random VLM built locally (no hub); set ``OMP_NUM_THREADS=1``
on a shared CPU.

    python benchmarks/vlm_decode_workers.py [--arch qwen2-vl] [--samples 48] [--image-size 448] [--workers 0 1 2]

``--vllm`` scores with ``vllm:model=...,mode=yes_prob`` instead (its CPU half: the cap, the image hash and the
prompt text); it needs vLLM and a CUDA device and otherwise prints why and exits 0.

Prints numbers; never passes or fails on time.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from score_throughput import make_corpus, run_one  # noqa: E402


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="qwen2-vl")
    ap.add_argument("--samples", type=int, default=48, help="captions (3 sentences each)")
    ap.add_argument("--per-shard", type=int, default=12)
    ap.add_argument("--image-size", type=int, default=448)
    ap.add_argument("--batch-size", type=int, default=12)
    ap.add_argument("--mode", default="yes_prob")
    ap.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--vllm", action="store_true", help="the vllm: detector instead (needs vLLM and CUDA)")
    args = ap.parse_args(argv)
    if args.vllm:
        import vllm_judge_bench

        why = vllm_judge_bench.unavailable()
        if why:
            print(f"vllm: skipped ({why})")
            return {"vllm/skipped": why}
    import pyarrow.parquet as pq

    from halsift.synth.tiny_vlm import build_tiny_vlm

    res: dict = {}
    with tempfile.TemporaryDirectory(prefix="halsift-vlmw-") as tmp:
        root = Path(tmp)
        model = build_tiny_vlm(args.arch, root / "vlm", seed=0, init_std=0.5)
        data = make_corpus(root / "data", args.samples, args.per_shard, args.image_size)
        spec = f"vlm:model={model},mode={args.mode},dtype=float32,device={args.device},forward_batch={args.batch_size}"
        if args.vllm:
            spec = f"vllm:model={model},mode=yes_prob,max_model_len=4096,gpu_memory_utilization=0.5"
        tables = {}
        for w in args.workers:
            m = run_one(spec, data, root / f"out{w}", args.batch_size, args.device, workers=w)
            tables[w] = [pq.read_table(p) for p in sorted((root / f"out{w}").glob("part-*.parquet"))]
            res[f"workers{w}/sentences_per_s"] = m["sentences_per_s"]
            res[f"workers{w}/time_share"] = m["time_share"]
            print(f"decode workers {w}: {m['sentences_per_s']:.1f} sentences/s  time share (%) {m['time_share']}",
                  flush=True)
        first = tables[args.workers[0]]
        res["identical_scores"] = all(len(t) == len(first) and all(a.equals(b) for a, b in zip(first, t))
                                      for t in tables.values())
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
