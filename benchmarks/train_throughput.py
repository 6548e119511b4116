"""Training throughput: ``halsift train clip`` vs ``open_clip_train.main`` on the same shards, model, batch size.

    python benchmarks/train_throughput.py                      # CPU: halsift-tiny, batch 32, 30 steps
    python benchmarks/train_throughput.py --model ViT-B-32 --batch-size 256 --steps 60 --precision bf16   # GPU

Prints the median per-step samples/s (first steps dropped as warm-up) and the peak memory of each, and the
ratio halsift / open_clip; on a GPU also the model FLOP utilisation (MFU: training FLOPs per sample, counted by
``torch.utils.flop_counter`` on one forward + backward, times samples/s, over ``--peak-tflops``, in %). Peak memory is the largest process's RSS on CPU, and ``nvidia-smi``'s peak
``used_memory`` on GPU. open_clip_train is run through ``open_clip_train.main.main(argv)`` in a child process
(after registering halsift's tiny config, which its CLI cannot add); its own data loader, loss and loop are used.
Never pass/fail: it prints numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from halsift.corpus.percent import percent

_WRAP = ("import resource, subprocess, sys; rc = subprocess.run(sys.argv[1:]).returncode; "
         "print('PEAK_RSS_KB', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, flush=True); sys.exit(rc)")
_OPENCLIP = ("import sys; from halsift.filtering.models.clip_models import register_builtin_configs; "
             "register_builtin_configs(); from open_clip_train.main import main; main(sys.argv[1:])")


def make_shards(out: Path, n: int, size: int, per_shard: int = 256) -> Path:
    """Random-ish PNG pairs (coloured squares + captions) in our shard layout, with sizes.json."""
    import io

    import numpy as np
    from PIL import Image

    from halsift.corpus.shards import Sample, ShardWriter

    rng = np.random.default_rng(0)
    with ShardWriter(out, maxcount=per_shard) as w:
        for i in range(n):
            a = rng.integers(0, 255, size=(size, size, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(a).save(buf, "PNG")
            w.write(Sample(key=f"b{i:07d}", image=buf.getvalue(), caption=f"a photo number {i} of noise",
                           ext="png", meta={"captioner": "bench", "source": "i2t"}))
    return out


class GpuPeak:
    """Poll nvidia-smi's used memory while a run is going (no-op without a GPU)."""

    def __init__(self) -> None:
        self.peak_mib = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            try:
                r = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True, timeout=5)
                self.peak_mib = max([self.peak_mib] + [int(x) for x in r.stdout.split() if x.strip().isdigit()])
            except (OSError, subprocess.SubprocessError):
                return
            time.sleep(0.5)

    def __enter__(self):
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join(timeout=6)


def _run(cmd: list[str], env: dict) -> tuple[str, int, int]:
    """Run ``cmd`` under the RSS wrapper; returns (combined output, peak RSS KiB, peak GPU MiB)."""
    with GpuPeak() as gpu:
        p = subprocess.run([sys.executable, "-c", _WRAP, *cmd], env=env, capture_output=True, text=True)
    out = p.stdout + p.stderr
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[:6])} ... failed (rc {p.returncode}):\n{out[-3000:]}")
    rss = int(re.findall(r"PEAK_RSS_KB (\d+)", out)[-1])
    return out, rss, gpu.peak_mib


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="halsift-tiny")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup-steps", type=int, default=5, help="first steps dropped from the median")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--image-size", type=int, default=64, help="stored image size (the model resizes)")
    ap.add_argument("--precision", default="auto", help="auto | fp32 | bf16 (bf16 = autocast on GPU)")
    ap.add_argument("--shards", default="", help="existing shard folder (default: write random ones)")
    ap.add_argument("--out", default="", help="work folder (default: a temp folder)")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100 SXM: 989)")
    ap.add_argument("--json", default="", help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    import torch

    gpu = torch.cuda.is_available()
    precision = ("bf16" if gpu else "fp32") if args.precision == "auto" else args.precision
    work = Path(args.out or tempfile.mkdtemp(prefix="halsift-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    n = args.steps * args.batch_size
    per_shard = max(1, -(-n // max(2, args.workers * 2)))
    shards = Path(args.shards) if args.shards else make_shards(work / "shards", n, args.image_size, per_shard)
    sizes = json.loads((shards / "sizes.json").read_text())
    names = sorted(sizes)
    pattern = str(shards / f"{{{names[0][:-4]}..{names[-1][:-4]}}}.tar")
    env = dict(os.environ, WANDB_MODE="disabled", HALSIFT_QUIET="1")
    print(f"device={'cuda' if gpu else 'cpu'} model={args.model} batch={args.batch_size} steps={args.steps} "
          f"precision={precision} shards={len(names)} samples={sum(sizes.values())}")

    hs_out = work / "halsift_run"
    text, hs_rss, hs_gpu = _run([sys.executable, "-m", "halsift.launch.cli", "train", "clip", "--data", str(shards),
                                 "--out", str(hs_out), "--model", args.model, "--batch-size", str(args.batch_size),
                                 "--steps", str(args.steps), "--workers", str(args.workers), "--precision",
                                 precision, "--wandb-mode", "disabled", "--warmup", "1", "--shuffle-buffer", "0",
                                 "--lr", "1e-4", "--log-every", "1"], env)
    rates = [json.loads(x)["train/samples_per_s"] for x in (hs_out / "metrics.jsonl").read_text().splitlines()
             if "train/samples_per_s" in x][args.warmup_steps:]
    hs_rate = statistics.median(rates)

    oc_logs = work / "openclip_logs"
    text, oc_rss, oc_gpu = _run([sys.executable, "-c", _OPENCLIP, "--train-data", pattern, "--dataset-type",
                                 "webdataset", "--train-num-samples", str(n), "--batch-size", str(args.batch_size),
                                 "--epochs", "1", "--model", args.model, "--workers", str(args.workers),
                                 "--precision", "amp_bf16" if precision == "bf16" else "fp32", "--lr", "1e-4",
                                 "--warmup", "1", "--logs", str(oc_logs), "--name", f"bench{os.getpid()}",
                                 "--save-frequency", "0", "--log-every-n-steps", "1", "--report-to", "",
                                 *([] if gpu else ["--device", "cpu"])], env)
    oc_rates = [float(x) for x in re.findall(r"Batch \(t\): [\d.]+, ([\d.]+)/s", text)][args.warmup_steps:]
    if not oc_rates:
        raise RuntimeError(f"no throughput lines in open_clip_train's output:\n{text[-2000:]}")
    oc_rate = statistics.median(oc_rates)

    mem = (lambda kib, mib: f"{mib} MiB GPU, {kib / 1024:.0f} MiB RSS") if gpu else (lambda kib, mib: f"{kib / 1024:.0f} MiB RSS")
    print(f"halsift train clip : {hs_rate:10.1f} samples/s   peak {mem(hs_rss, hs_gpu)}")
    print(f"open_clip_train    : {oc_rate:10.1f} samples/s   peak {mem(oc_rss, oc_gpu)}")
    print(f"ratio halsift/open_clip: {hs_rate / oc_rate:.2f}x samples/s, "
          f"{(hs_gpu / oc_gpu if gpu and oc_gpu else hs_rss / oc_rss):.2f}x peak memory")
    res = {"device": "cuda" if gpu else "cpu", "model": args.model, "batch_size": args.batch_size,
           "steps": args.steps, "precision": precision, "halsift_samples_per_s": round(hs_rate, 2),
           "open_clip_samples_per_s": round(oc_rate, 2), "ratio": round(hs_rate / oc_rate, 3),
           "halsift_peak_rss_mib": round(hs_rss / 1024), "open_clip_peak_rss_mib": round(oc_rss / 1024)}
    if gpu:
        flops = train_flops_per_sample(args.model, args.batch_size)
        res.update({"train_gflops_per_sample": round(flops / 1e9, 2), "halsift_gpu_peak_mib": hs_gpu,
                    "open_clip_gpu_peak_mib": oc_gpu,
                    "halsift_mfu": percent(flops * hs_rate / (args.peak_tflops * 1e12), 2),  # %
                    "open_clip_mfu": percent(flops * oc_rate / (args.peak_tflops * 1e12), 2)})
        print(f"MFU: halsift {res['halsift_mfu']:.1f}%, open_clip_train {res['open_clip_mfu']:.1f}% "
              f"({res['train_gflops_per_sample']} GFLOP per sample, peak {args.peak_tflops} TFLOP/s)")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


def train_flops_per_sample(model_name: str, batch: int) -> float:
    """FLOPs of one training step per sample (forward + backward of both towers and the contrastive loss),
    counted by ``torch.utils.flop_counter.FlopCounterMode`` on the GPU in bf16."""
    import open_clip
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from halsift.training.clip_config import ensure_model_configs

    ensure_model_configs()
    model = open_clip.create_model(model_name, device="cuda")
    size = model.visual.image_size
    size = size if isinstance(size, (tuple, list)) else (size, size)
    images = torch.randn(batch, 3, *size, device="cuda")
    texts = torch.randint(0, 1000, (batch, model.context_length), device="cuda")
    loss_fn = open_clip.ClipLoss()
    with FlopCounterMode(display=False) as counter, torch.autocast("cuda", dtype=torch.bfloat16):
        img, txt, scale = model(images, texts)[:3]
        loss_fn(img, txt, scale).backward()
    return counter.get_total_flops() / batch


if __name__ == "__main__":
    sys.exit(main())
