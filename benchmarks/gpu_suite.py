"""Every performance figure on one GPU, in one command and one JSON that is always written: under 8 minutes on one
H100 (``--quick``: under 4, model builds included; count on ~16 host cores).

    python benchmarks/gpu_suite.py --out gpu_suite.json           # on a machine with a CUDA device
    python benchmarks/gpu_suite.py --quick --out gpu_suite.json   # the short version (fewer sizes and samples)
    python benchmarks/gpu_suite.py --smoke --out smoke.json       # CPU, tiny settings: checks the plumbing

Runs, each in its own process with its own time limit (``--budget`` caps the whole suite: a part gets at most what
is left of it), the most wanted first (``clip``, ``judge``, ``product``, then ``train``):

1. ``judge``: ``judge_throughput.py`` on the Qwen2-VL-2B architecture with random weights (448 px images): the
   seeds' generate-then-parse protocol vs ``logits`` with and without image-prefix reuse, and the fraction of the
   bf16 peak reached.
2. ``clip``: ``score_throughput.py`` with the ViT-B/32 CLIP scorer (random weights, bf16) on 512 px JPEG shards
   written by the benchmark (photo-like, then uniform noise: the worst case for a JPEG decoder), 14 decode workers,
   batch 512, JPEGs decoded by the workers (``decode=cpu``) and on the GPU
   (``decode=gpu``): sentences/s, pipeline efficiency (runner / bare model), time shares, host CPU ms per sentence,
   then the model process's main thread profiled once per setting on the photos (cProfile).
3. ``train`` (full suite only): ``train_throughput.py``: ``halsift train clip`` vs ``open_clip_train``, ViT-B/32,
   batch 256, bf16.
4. ``product``: ``product_path.py``: ``halsift score`` from the command line on shards on disk with the
   2B-architecture judge saved to disk (random weights), then ``halsift select``: sentences/s as a user gets them,
   with the FLOPs per sentence and the bf16 peak used for "% of peak" beside them.

``--vllm`` adds a part ``vllm_judge``: ``judge_throughput.py --vllm`` (the ``vllm:`` detector next to the transformers
judge; needs vLLM, else the part records why it was skipped).

Every part writes its figures as it measures them (``PARTS/NAME.json``, ``PARTS`` = the ``--out`` file's name with
``_parts``); the suite merges them into ``--out``, rewritten as each part ends. A part stopped at its time limit
keeps what it measured (``"stopped": true``); a failed part keeps its figures, exit code and the tail of its
output; the other parts still run. Paste the printed summary into docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).parent

JUDGE = ["judge_throughput.py", "--arch", "qwen2-vl-2b-config", "--device", "cuda", "--image-size", "448",
         "--captions", "64", "--batch-size", "64", "--sentences", "1", "4", "8", "--prompt-captions", "16"]
CLIP = ["score_throughput.py", "--device", "cuda", "--arch", "ViT-B-32", "--image-size", "512", "--procs", "1",
        "--no-memory", "--decode-workers", "14", "--decode", "cpu,gpu"]  # 16 host cores: the model's process keeps 2
# part -> (command, time limit in seconds)
FULL = {
    "clip": (CLIP + ["--images", "photo,noise", "--samples", "4000", "--batch-sizes", "512", "--profile-main"], 150),
    "judge": (JUDGE, 150),
    "product": (["product_path.py", "--size", "2b", "--device", "cuda", "--captions", "512", "--sentences", "5",
                 "--batch-size", "64", "--decode-workers", "8"], 100),
    "train": (["train_throughput.py", "--model", "ViT-B-32", "--batch-size", "256", "--steps", "60",
               "--precision", "bf16", "--workers", "6"], 70),
}
QUICK = {  # the most wanted figures first: a part that does not fit the budget is the last one
    "clip": (CLIP + ["--images", "photo,noise", "--samples", "3000", "--batch-sizes", "512", "--profile-main"], 125),
    "judge": (["judge_throughput.py", "--arch", "qwen2-vl-2b-config", "--device", "cuda", "--image-size", "448",
               "--captions", "32", "--batch-size", "64", "--sentences", "1", "8", "--prompt-captions", "4",
               "--cot-tokens", "0", "--repeats", "1"], 55),
    "product": (["product_path.py", "--size", "2b", "--device", "cuda", "--captions", "160", "--sentences", "5",
                 "--batch-size", "64", "--decode-workers", "8"], 60),
}
SMOKE_CLIP = ["score_throughput.py", "--samples", "12", "--per-shard", "6", "--batch-sizes", "16", "--procs", "1",
              "--no-memory", "--decode-workers", "1", "--decode", "cpu,gpu", "--image-size", "96"]
SMOKE = {
    "clip": (SMOKE_CLIP + ["--images", "photo", "--profile-main"], 900),
    "judge": (["judge_throughput.py", "--size", "tiny", "--captions", "2", "--sentences", "1", "3", "--repeats", "1",
               "--cot-tokens", "8", "--threads", "1"], 600),
    "product": (["product_path.py", "--size", "tiny", "--captions", "4", "--sentences", "2"], 600),
    "train": (["train_throughput.py", "--steps", "8", "--warmup-steps", "2", "--batch-size", "16"], 600),
}
VLLM = {"vllm_judge": (["judge_throughput.py", "--arch", "qwen2-vl-2b-config", "--device", "cuda", "--image-size",
                        "448", "--captions", "64", "--batch-size", "64", "--sentences", "1", "5", "10", "20",
                        "--prompt-captions", "4", "--cot-tokens", "0", "--repeats", "2", "--vllm"], 240)}
VLLM_SMOKE = {"vllm_judge": (["judge_throughput.py", "--size", "tiny", "--captions", "2", "--sentences", "1",
                              "--repeats", "1", "--cot-tokens", "0", "--threads", "1", "--vllm"], 600)}
BUDGET = {"full": 480, "quick": 240, "smoke": 3600}  # seconds for the whole suite
MIN_PART_S = 20  # a part that would get less is not started (recorded as skipped)


def device_info() -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.cuda.is_available(),
            "host_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()}
    try:
        import torchvision

        info["torchvision"] = torchvision.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1), gpus=torch.cuda.device_count())
    return info


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def run_part(name: str, script: str, flags: list[str], limit: float, parts_dir: Path) -> dict:
    """Run one benchmark in its own process group for at most ``limit`` seconds; its figures (the JSON it writes as
    it goes, complete or not), exit code, wall time and output tail."""
    out = parts_dir / f"{name}.json"
    log, err = parts_dir / f"{name}.stdout.txt", parts_dir / f"{name}.stderr.txt"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, str(HERE / script), *flags, "--json", str(out)]
    start = time.perf_counter()
    with open(log, "w") as so, open(err, "w") as se:
        proc = subprocess.Popen(cmd, stdout=so, stderr=se, start_new_session=True,  # its workers: one group
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})  # printed lines survive a stop
        stopped = False
        try:
            proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            stopped = True
            for sig, grace in ((signal.SIGTERM, 5), (signal.SIGKILL, 10)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
    part = {"command": " ".join(["python", f"benchmarks/{script}", *flags]), "limit_s": round(limit),
            "wall_s": round(time.perf_counter() - start, 1), "returncode": proc.returncode, "stopped": stopped}
    try:
        part["figures"] = json.loads(out.read_text())
    except (OSError, json.JSONDecodeError):  # none written yet, or cut mid-write by the stop
        part["figures"] = None
    part["stdout_tail"] = _tail(log, 1500)
    if stopped or proc.returncode != 0:
        part["stderr_tail"] = _tail(err, 3000)
    return part


def summary(name: str, part: dict) -> list[str]:
    """Printed lines of a part's headline figures."""
    f = part.get("figures") or {}
    lines = []
    if name.startswith("clip"):
        for r in f.get("runs", []):
            cpu = r.get("cpu_ms_per_sentence", {})
            lines.append(f"  {r.get('images')} decode={r.get('decode')} batch {r['batch']}: {r['sentences_per_s']:.0f} sentences/s, bare "
                         f"{r['bare_sentences_per_s']:.0f}, efficiency {r['pipeline_efficiency']:.2f}, CPU ms/sentence "
                         f"main {cpu.get('main')} + workers {cpu.get('workers')}, decode {r.get('image_decode', '')}")
    elif name == "product" and "score" in f:
        s = f["score"]
        lines.append(f"  score: {s.get('sentences_per_s')} sentences/s (scoring loop), "
                     f"{s.get('end_to_end_sentences_per_s')} end to end; {f.get('flops_per_sentence_G')} GFLOP/sentence"
                     f" = {f.get('achieved_tflops')} TFLOP/s = {f.get('percent_of_peak')}% of {f.get('peak_tflops_bf16')}"
                     f" TFLOP/s bf16 ({f.get('peak_source')}); select {f.get('select', {}).get('wall_s')} s")
    elif name.endswith("judge"):
        lines += [f"  {k}: {v}" for k, v in f.items() if k.endswith("sentences_per_s") or "peak" in k]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_suite.json")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--smoke", action="store_true", help="tiny CPU settings (plumbing check, numbers mean nothing)")
    mode.add_argument("--quick", action="store_true", help="the short suite (under 4 minutes on one H100)")
    ap.add_argument("--only", nargs="*", default=[], help="run only these parts (clip, judge, product, train, "
                                                          "vllm_judge)")
    ap.add_argument("--vllm", action="store_true", help="add the vllm_judge part (the vllm: detector next to the "
                                                         "transformers judge; needs vLLM)")
    ap.add_argument("--budget", type=float, default=None, help="seconds for the whole suite (default 480; 240 "
                                                              "--quick)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    info = device_info()
    if not args.smoke and not info["cuda"]:
        raise SystemExit("gpu_suite: no CUDA device; run on a GPU machine, or pass --smoke for the CPU plumbing check")
    kind = "smoke" if args.smoke else "quick" if args.quick else "full"
    plan = {"smoke": SMOKE, "quick": QUICK, "full": FULL}[kind]
    if args.vllm:
        plan = {**plan, **(VLLM_SMOKE if args.smoke else VLLM)}
    unknown = set(args.only) - set(plan)
    if unknown:
        raise SystemExit(f"gpu_suite: --only {' '.join(sorted(unknown))}: not a part of this suite "
                         f"({', '.join(plan)})")
    budget = args.budget or BUDGET[kind]
    out = Path(args.out)
    parts_dir = out.with_name(out.stem + "_parts")
    parts_dir.mkdir(parents=True, exist_ok=True)
    res: dict = {"device": info, "suite": kind, "smoke": args.smoke, "budget_s": budget, "parts": {}}

    def save() -> None:
        res["wall_s"] = round(time.perf_counter() - t0, 1)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(res, indent=1))
        os.replace(tmp, out)

    save()
    for name, ((script, *flags), limit) in plan.items():
        if args.only and name not in args.only:
            continue
        left = budget - (time.perf_counter() - t0)
        if left < MIN_PART_S:
            res["parts"][name] = {"skipped": f"suite budget spent ({budget:.0f} s)"}
            print(f"{name}: skipped (budget spent)", flush=True)
            save()
            continue
        part = run_part(name, script, flags, min(limit, left), parts_dir)
        res["parts"][name] = part
        save()
        state = "stopped at its limit" if part["stopped"] else "ok" if part["returncode"] == 0 else "FAILED"
        print(f"{name}: {state} in {part['wall_s']} s (limit {part['limit_s']} s)", flush=True)
        for line in summary(name, part):
            print(line, flush=True)
        if state == "FAILED":
            print("  " + (part.get("stderr_tail") or "")[-600:].replace("\n", "\n  "), flush=True)
    save()
    print(f"wrote {out} ({res['wall_s']} s)")
    return 0 if all(p.get("returncode") == 0 for p in res["parts"].values() if "returncode" in p) else 1


if __name__ == "__main__":
    sys.exit(main())
