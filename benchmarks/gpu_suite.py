"""Every performance figure on one GPU, in one command and one JSON (under 10 minutes on one H100).

    python benchmarks/gpu_suite.py --out gpu_suite.json           # on a machine with a CUDA device
    python benchmarks/gpu_suite.py --smoke --out smoke.json       # CPU, tiny settings: checks the plumbing

Runs, each in its own process:

1. ``judge_throughput.py`` on the Qwen2-VL-2B architecture with random weights (448 px images, 1/4/8 sentences
   per caption): the seeds' generate-then-parse protocol (score prompt, 6 tokens; CoT, 96 tokens) vs ``logits``
   with and without image-prefix reuse, and the fraction of the bf16 peak reached.
2. ``score_throughput.py`` with the ViT-B/32 CLIP scorer (random weights, bf16 by default on CUDA) on JPEG shards
   written by the benchmark, 8 decode workers: sentences/s per batch size, pipeline efficiency (runner / bare
   model), time shares.
3. ``train_throughput.py``: ``halsift train clip`` vs ``open_clip_train`` on the same shards, ViT-B/32, batch
   256, bf16: samples/s, peak memory and MFU.

``--vllm`` adds a part ``vllm_judge``: ``judge_throughput.py --vllm`` on the same Qwen2-VL-2B architecture at 1/5/10/20
sentences per image, the transformers judge (``logits`` with and without prefix reuse) next to the ``vllm:`` detector
(``mode=yes_prob``, requests grouped by image vs shuffled, vLLM's prefix-cache hit rate). It needs vLLM
(``pip install 'halsift[vllm]'``); without it the part records why it was skipped.

The JSON holds each benchmark's figures under its name, with the device, the wall time of each part and the
exit code of any that failed (the others still run). Paste its table into docs/performance.md's current figures.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent

FULL = {
    "judge": ["judge_throughput.py", "--arch", "qwen2-vl-2b-config", "--device", "cuda", "--image-size", "448",
              "--captions", "64", "--batch-size", "64", "--sentences", "1", "4", "8", "--prompt-captions", "16"],
    "score": ["score_throughput.py", "--device", "cuda", "--arch", "ViT-B-32", "--samples", "4000",
              "--image-size", "512", "--batch-sizes", "128,512,1024", "--procs", "1", "--no-memory",
              "--decode-workers", "8"],  # 16 host cores per GPU: the model's process keeps one, and more
    "train": ["train_throughput.py", "--model", "ViT-B-32", "--batch-size", "256", "--steps", "60",
              "--precision", "bf16", "--workers", "6"],
}
VLLM = {"vllm_judge": ["judge_throughput.py", "--arch", "qwen2-vl-2b-config", "--device", "cuda", "--image-size", "448",
                       "--captions", "64", "--batch-size", "64", "--sentences", "1", "5", "10", "20",
                       "--prompt-captions", "4", "--cot-tokens", "0", "--repeats", "2", "--vllm"]}
VLLM_SMOKE = {"vllm_judge": ["judge_throughput.py", "--size", "tiny", "--captions", "2", "--sentences", "1",
                             "--repeats", "1", "--cot-tokens", "0", "--threads", "1", "--vllm"]}
SMOKE = {
    "judge": ["judge_throughput.py", "--size", "tiny", "--captions", "2", "--sentences", "1", "3", "--repeats", "1",
              "--cot-tokens", "8", "--threads", "1"],
    "score": ["score_throughput.py", "--samples", "24", "--batch-sizes", "16", "--procs", "1", "--no-memory",
              "--decode-workers", "1"],
    "train": ["train_throughput.py", "--steps", "8", "--warmup-steps", "2", "--batch-size", "16"],
}


def device_info() -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), gpus=torch.cuda.device_count())
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_suite.json")
    ap.add_argument("--smoke", action="store_true", help="tiny CPU settings (plumbing check, numbers mean nothing)")
    ap.add_argument("--only", nargs="*", default=[], help="run only these parts (judge, score, train, vllm_judge)")
    ap.add_argument("--vllm", action="store_true", help="add the vllm_judge part (the vllm: detector next to the "
                                                         "transformers judge; needs vLLM)")
    args = ap.parse_args(argv)
    info = device_info()
    if not args.smoke and not info["cuda"]:
        raise SystemExit("gpu_suite: no CUDA device; run on a GPU machine, or pass --smoke for the CPU plumbing check")
    plan = SMOKE if args.smoke else FULL
    if args.vllm:
        plan = {**plan, **(VLLM_SMOKE if args.smoke else VLLM)}
    res: dict = {"device": info, "smoke": args.smoke, "parts": {}}
    work = Path(tempfile.mkdtemp(prefix="gpu_suite_"))
    for name, (script, *flags) in plan.items():
        if args.only and name not in args.only:
            continue
        out = work / f"{name}.json"
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, str(HERE / script), *flags, "--json", str(out)], text=True,
                              capture_output=True)
        part = {"command": " ".join(["python", f"benchmarks/{script}", *flags]),
                "wall_s": round(time.perf_counter() - start, 1), "returncode": proc.returncode}
        if proc.returncode == 0 and out.exists():
            part["figures"] = json.loads(out.read_text())
        else:
            part["stderr_tail"] = proc.stderr[-3000:]
        res["parts"][name] = part
        print(f"{name}: {'ok' if proc.returncode == 0 else 'FAILED'} in {part['wall_s']} s", flush=True)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out}")
    return 0 if all(p["returncode"] == 0 for p in res["parts"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
