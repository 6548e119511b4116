"""Throughput of the ``clip`` detector through the scoring runner: sentences/s over batch sizes, 1 vs 2
processes, the share of time in data loading (tar read + image decode + parquet write) vs the model, the
pipeline efficiency (runner sentences/s over the bare model's: the same batches, already preprocessed and
tokenized, through ``encode_image`` + ``encode_text`` alone; 1.0 = the input pipeline costs nothing), and peak
memory for 1x vs 10x the shards (scoring streams, so it should not grow). ``--json PATH`` also writes every
figure as JSON. Set ``OMP_NUM_THREADS=1`` on a shared CPU.

    python benchmarks/score_throughput.py                      # CPU: halsift-tiny, small corpus
    python benchmarks/score_throughput.py --device cuda        # GPU: ViT-B-32, random weights
    python benchmarks/score_throughput.py --device cuda --decode cpu,gpu --images photo   # host vs GPU JPEG decoding

``--decode`` runs each setting of the clip detector's ``decode`` option (``cpu``: decode workers decode with
libjpeg-turbo; ``gpu``: they ship the JPEG bytes and the model's device decodes them; on a CPU that is torchvision's
CPU decoder) on the same corpus and bare-model figure. ``--json`` is rewritten after every run, so a run stopped by
a time limit keeps what it measured. Prints numbers; never passes or fails on time.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image


_BASE = None  # the corpus's base image, inherited by forked JPEG encoders


def _jpeg(i: int) -> bytes:
    import numpy as np

    buf = io.BytesIO()
    Image.fromarray(np.roll(_BASE, i * 7, axis=1)).save(buf, "JPEG", quality=85)
    return buf.getvalue()


def make_corpus(out: Path, samples: int, per_shard: int, image_size: int, seed: int = 0,
                images: str = "noise") -> Path:
    """JPEGs with 3 sentences each: ``noise`` (uniform noise, the worst case for a JPEG decoder: every
    coefficient is coded) or ``photo`` (smooth gradients plus mild noise, closer to real photos). Encoded on every
    core (forked processes) when there are many."""
    import multiprocessing as mp

    import numpy as np

    from halsift.corpus.shards import Sample, ShardWriter

    global _BASE
    rng = np.random.default_rng(seed)
    r = random.Random(seed)
    if images == "noise":
        _BASE = rng.integers(0, 255, (image_size, image_size, 3), dtype=np.uint8)
    else:
        x = np.linspace(0, 1, image_size)
        grad = np.stack([np.add.outer(x, x) * 110, np.outer(1 - x, x) * 255, np.outer(x, 1 - x) * 255], -1)
        _BASE = np.clip(grad + rng.normal(0, 6, grad.shape), 0, 255).astype(np.uint8)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if samples >= 256 and cores > 2:
        with mp.get_context("fork").Pool(cores) as pool:
            jpegs = pool.map(_jpeg, range(samples), chunksize=64)
    else:
        jpegs = [_jpeg(i) for i in range(samples)]
    with ShardWriter(out, maxcount=per_shard) as w:
        for i in range(samples):
            sents = [{"text": f"A photo of {r.choice(['a dog', 'two cats', 'a red car'])} number {i}-{j}.",
                      "position": j, "label": "correct", "types": [], "spans": []} for j in range(3)]
            w.write(Sample(f"b{i:07d}", jpegs[i], " ".join(s["text"] for s in sents), ext="jpg",
                           meta={"captioner": "bench", "source": "i2t", "sentences": sents}))
    return out


_RUN = """
import json, resource
import open_clip
from halsift.filtering.scoring import parts, runner, workers

def cpu():
    return [sum(resource.getrusage(w)[:2]) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]

loop = [0.0, 0.0]

def measured(fn):  # the scoring loop alone: not the imports, the model load nor CUDA's start
    def run(*a, **kw):
        c = cpu()
        try:
            return fn(*a, **kw)
        finally:
            loop[:] = [x + b - a for x, a, b in zip(loop, c, cpu())]  # workers: reaped by the loop's end
    return run

workers.score_parts_in_workers = measured(workers.score_parts_in_workers)
parts.score_part = measured(parts.score_part)  # the one loop every engine runs (ScoreMaker)
c0 = cpu()
if WARM:  # one shard first, in this process: CUDA's, cuBLAS's and nvJPEG's start-up are not the steady state
    runner.score(SPEC, WARM, OUT + "-warmup", batch_size=BATCH, device=DEVICE, show_progress=False, workers=WORKERS)
    loop[:] = [0.0, 0.0]
runner.score(SPEC, DATA, OUT, batch_size=BATCH, device=DEVICE, show_progress=False, workers=WORKERS)
print(json.dumps({"all": [b - a for a, b in zip(c0, cpu())], "loop": loop}))
"""


def run_one(spec: str, data: Path, out: Path, batch: int, device: str, workers: int = 0) -> dict:
    """Score in a fresh process, as ``halsift score`` would (not in this one, whose heap still holds the bare
    measurement's batches for the workers to fork); the manifest plus ``cpu_ms_per_sentence``: CPU of that
    process's scoring loop (``main``) and of its decode workers (``workers``) per sentence, and of the whole call
    (``main_with_start``: model load, CUDA start, writing). On CUDA one shard is scored first in the same process
    (a warm-up: the figures are the steady state a long run reaches, worker start-up included)."""
    warm = str(sorted(data.glob("*.tar"))[0]) if device.startswith("cuda") else ""
    code = (f"SPEC, DATA, OUT, BATCH, DEVICE, WORKERS, WARM = {spec!r}, {str(data)!r}, {str(out)!r}, {batch}, "
            f"{device!r}, {workers}, {warm!r}\n" + _RUN)
    res = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={**os.environ, "HALSIFT_QUIET": "1"})
    cpu = json.loads(res.stdout.strip().splitlines()[-1])
    m = json.loads((out / "_manifest.json").read_text())
    n = max(m.get("sentences_scored_this_run") or 1, 1)
    m["cpu_ms_per_sentence"] = {"main": round(1e3 * cpu["loop"][0] / n, 4), "workers": round(1e3 * cpu["loop"][1] / n, 4),
                                "main_with_start": round(1e3 * cpu["all"][0] / n, 4)}
    return m


_PROFILE = """
import cProfile, json, pstats
import open_clip
from halsift.filtering.scoring import parts, runner, workers
prof = cProfile.Profile()

def profiled(fn):  # only the scoring loop: not the imports nor the model load
    def run(*a, **kw):
        prof.enable()
        try:
            return fn(*a, **kw)
        finally:
            prof.disable()
    return run

workers.score_parts_in_workers = profiled(workers.score_parts_in_workers)
parts.score_part = profiled(parts.score_part)
runner.score(SPEC, DATA, OUT, batch_size=BATCH, device=DEVICE, show_progress=False, workers=WORKERS)
st = pstats.Stats(prof).stats
tot = sum(v[2] for v in st.values()) or 1.0
rows = sorted(((v[2], v[3], f"{k[2]} ({k[0].rsplit('/', 1)[-1]}:{k[1]})") for k, v in st.items()), reverse=True)
print(json.dumps({"total_s": round(tot, 3), "top_own_time": [
    {"function": n, "own_share": round(a / tot, 4), "cumulative_s": round(c, 3)} for a, c, n in rows[:TOP]]}))
"""


def profile_main(spec: str, data: Path, out: Path, batch: int, device: str, workers: int, top: int = 25) -> dict:
    """Where the scoring process's main thread spends its scoring loop (cProfile, in a fresh process as
    :func:`run_one`; imports and the model load left out): the ``top`` functions by own time, each with its share of
    the loop's profiled time."""
    code = (f"SPEC, DATA, OUT, BATCH, DEVICE, WORKERS, TOP = {spec!r}, {str(data)!r}, {str(out)!r}, {batch}, "
            f"{device!r}, {workers}, {top}\n" + _PROFILE)
    res = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={**os.environ, "HALSIFT_QUIET": "1"})
    return json.loads(res.stdout.strip().splitlines()[-1])


def _spec(arch: str, fast_decode: bool, decode: str) -> str:
    """The clip spec measured (precision=auto: bf16 + TF32 on CUDA, fp32 on CPU)."""
    return (f"clip:arch={arch},pretrained=random,seed=0" + (",fast_decode=true" if fast_decode else "")
            + f",decode={decode}")


def run_torchrun(spec: str, data: Path, out: Path, batch: int, device: str, nproc: int) -> dict:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(port),
           "-m", "halsift.launch.cli", "score", "--detector", spec, "--data", str(data), "--out", str(out),
           "--batch-size", str(batch), "--device", device, "--no-progress"]
    env = {**os.environ, "HALSIFT_QUIET": "1"}
    if device == "cpu":
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 2) // nproc))
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    return json.loads((out / "_manifest.json").read_text())


def peak_rss_mb(spec: str, data: Path, out: Path, batch: int, device: str) -> float:
    code = ("import resource,sys;from halsift.filtering.scoring.runner import score;"
            f"score({spec!r},{str(data)!r},{str(out)!r},batch_size={batch},device={device!r},show_progress=False);"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
    res = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True,
                         env={**os.environ, "HALSIFT_QUIET": "1"})
    return int(res.stdout.strip().splitlines()[-1]) / 1024


def bare_rate(spec: str, data: Path, batch: int, device: str, repeats: int = 3, max_batches: int = 12) -> float:
    """Sentences/s of the model alone on the corpus's first ``max_batches`` batches (images preprocessed and texts
    tokenized first; each image encoded once per caption, as the runner does)."""
    import itertools

    import time

    import torch

    from halsift.corpus.images import SkipCounter
    from halsift.filtering.scoring.parts import batches, iter_caption_groups, plan_parts
    from halsift.filtering.detectors.spec import load_detector

    det = load_detector(spec).to(device)
    parts, _ = plan_parts(str(data))
    batches = list(itertools.islice((b for part in parts for b in batches(
        iter_caption_groups(part, "sentence", SkipCounter(), arrays=True), batch)), max_batches))
    from halsift.filtering.models.clip_models import encode_text

    dtype = next(det.model.parameters()).dtype
    ready = []
    for b in batches:  # the host path's pixels (equal bit for bit to open_clip's per-image preprocessing)
        images = list({id(it.image): it.image for it in b}.values())
        ready.append((det.pixels.finish(det.pixels(images), device, dtype),
                      det.tokenizer([it.sentence for it in b]).to(device)))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats):
            sync()
            t = time.perf_counter()
            for pix, tok in ready:
                det.model.encode_image(pix)
                encode_text(det.model, tok)  # as the detector runs it (padding cut to the longest text)
            sync()
            best = min(best, time.perf_counter() - t)
    return sum(len(b) for b in batches) / best


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--arch", default=None, help="default: halsift-tiny on cpu, ViT-B-32 on cuda")
    p.add_argument("--samples", type=int, default=None, help="samples (3 sentences each); default 96 cpu / 2000 cuda")
    p.add_argument("--per-shard", type=int, default=None)
    p.add_argument("--image-size", type=int, default=256)
    p.add_argument("--images", default="noise", help="JPEG content, a comma list: noise (worst-case decode) or photo "
                                                     "(photo-like gradients); the bare model is measured on the first")
    p.add_argument("--fast-decode", action="store_true",
                   help="the clip detector's fast_decode=true (JPEGs decoded at a reduced DCT scale)")
    p.add_argument("--batch-sizes", default=None, help="comma list; default 8,32,96 cpu / 32,128,512 cuda")
    p.add_argument("--procs", default="1,2", help="process counts to compare")
    p.add_argument("--no-memory", action="store_true", help="skip the 1x vs 10x shards memory check")
    p.add_argument("--json", default="", help="also write the figures to this JSON file")
    p.add_argument("--decode-workers", type=int, default=0, help="input processes per rank (score --decode-workers)")
    p.add_argument("--repeats", type=int, default=1, help="runs per setting; the fastest is reported")
    p.add_argument("--profile-main", action="store_true", help="after the timed runs, one cProfile'd run per decode "
                                                                   "setting at the largest batch: the model process's "
                                                                   "main thread, top functions by own time")
    p.add_argument("--decode", default="cpu", help="comma list of the clip detector's decode settings to run "
                                                   "(cpu, gpu, auto)")
    a = p.parse_args(argv)
    gpu = a.device.startswith("cuda")
    arch = a.arch or ("ViT-B-32" if gpu else "halsift-tiny")
    samples = a.samples or (2000 if gpu else 96)
    per_shard = a.per_shard or max(1, samples // max(8, 2 * a.decode_workers))  # every worker gets parts
    batches = [int(x) for x in (a.batch_sizes or ("32,128,512" if gpu else "8,32,96")).split(",")]
    decodes = [d.strip() for d in a.decode.split(",") if d.strip()]
    kinds = [k.strip() for k in a.images.split(",") if k.strip()]
    if not kinds or set(kinds) - {"noise", "photo"}:
        p.error(f"--images {a.images}: expected a comma list of noise and photo")
    spec = _spec(arch, a.fast_decode, "cpu")
    tmp = Path(tempfile.mkdtemp(prefix="halsift-bench-score-"))
    corpora = {k: make_corpus(tmp / f"data-{k}", samples, per_shard, a.image_size, images=k) for k in kinds[:1]}
    data = corpora[kinds[0]]
    print(f"device={a.device} arch={arch} samples={samples} sentences={3 * samples} shards="
          f"{len(list(data.glob('*.tar')))} image={a.image_size}px {','.join(kinds)} fast_decode={a.fast_decode} "
          f"cpus={os.cpu_count()}")
    res: dict = {"device": a.device, "arch": arch, "samples": samples, "sentences": 3 * samples,
                 "image_size": a.image_size, "images": kinds, "fast_decode": a.fast_decode,
                 "decode_workers": a.decode_workers, "runs": []}

    def save() -> None:  # after every measurement: a stopped run keeps what it measured
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1))

    save()
    bare = {}
    for b in batches:
        bare[b] = bare_rate(spec, data, b, a.device)
        res.setdefault("bare_sentences_per_s", {})[str(b)] = round(bare[b], 2)
        save()
    print(f"{'images':>6} {'decode':>6} {'procs':>5} {'batch':>6} {'sent/s':>10} {'bare/s':>10} {'effic.':>7} "
          f"{'data %':>7} {'model %':>8} {'decode %':>9}  CPU ms/sentence (main + workers)")
    def profile() -> None:
        for decode in sorted(decodes, key=lambda d: d != "gpu"):  # the GPU path first
            prof = profile_main(_spec(arch, a.fast_decode, decode), corpora[kinds[0]], tmp / f"prof-{decode}",
                                batches[-1], a.device, a.decode_workers)
            res.setdefault("profile_main", {})[decode] = prof
            save()
            print(f"main thread, {kinds[0]}, decode={decode}, batch {batches[-1]} (cProfile, {prof['total_s']} s): "
                  + "; ".join(f"{r['function']} {100 * r['own_share']:.1f}%" for r in prof["top_own_time"][:8]),
                  flush=True)

    for kind, decode in [(k, d) for k in kinds for d in decodes]:
        if kind not in corpora:
            corpora[kind] = make_corpus(tmp / f"data-{kind}", samples, per_shard, a.image_size, images=kind)
        data = corpora[kind]
        spec = _spec(arch, a.fast_decode, decode)
        for procs in [int(x) for x in a.procs.split(",")]:
            for b in batches:
                runs = []
                for r in range(max(1, a.repeats)):
                    out = tmp / f"out-{kind}-{decode}-p{procs}-b{b}-r{r}"
                    runs.append(run_one(spec, data, out, b, a.device, a.decode_workers) if procs == 1 else
                                run_torchrun(spec, data, out, b, a.device, procs))
                m = max(runs, key=lambda m: m["sentences_per_s"])
                ts = m["time_share"]
                eff = m["sentences_per_s"] / bare[b]
                cpu = m.get("cpu_ms_per_sentence")
                res["runs"].append({"images": kind, "decode": decode, "procs": procs, "batch": b,
                                    "sentences_per_s": m["sentences_per_s"],
                                    "all_sentences_per_s": [x["sentences_per_s"] for x in runs],
                                    "bare_sentences_per_s": round(bare[b], 2), "pipeline_efficiency": round(eff, 3),
                                    "time_share": ts, **({"cpu_ms_per_sentence": cpu} if cpu else {}),
                                    **({"image_decode": m["image_decode"]} if "image_decode" in m else {})})
                save()
                print(f"{kind:>6} {decode:>6} {procs:>5} {b:>6} {m['sentences_per_s']:>10.1f} {bare[b]:>10.1f} {eff:>7.2f} "
                      f"{ts['data']:>7.1f} {ts['model']:>8.1f} {ts.get('decode', 0):>9.1f}"  # the manifest's %
                      + (f"  {cpu['main']:.3f} + {cpu['workers']:.3f}" if cpu else ""), flush=True)
    if a.profile_main and "profile_main" not in res:
        profile()
    one = {(r["images"], r["decode"], r["batch"]): r["sentences_per_s"] for r in res["runs"] if r["procs"] == 1}
    for r in res["runs"]:
        if r["procs"] > 1 and (r["images"], r["decode"], r["batch"]) in one:
            r["scaling_vs_1_proc"] = round(r["sentences_per_s"] / one[(r["images"], r["decode"], r["batch"])], 2)
            print(f"{r['procs']} processes vs 1, batch {r['batch']}: {r['scaling_vs_1_proc']:.2f}x")
    if not a.no_memory:
        small = make_corpus(tmp / "m1", per_shard * 2, per_shard, a.image_size, seed=1, images=kinds[0])
        big = make_corpus(tmp / "m10", per_shard * 20, per_shard, a.image_size, seed=1, images=kinds[0])
        r1 = peak_rss_mb(spec, small, tmp / "mo1", batches[-1], a.device)
        r10 = peak_rss_mb(spec, big, tmp / "mo10", batches[-1], a.device)
        print(f"peak RSS: {r1:.0f} MB for 2 shards, {r10:.0f} MB for 20 shards (ratio {r10 / r1:.2f})")
        res["peak_rss_mb"] = {"2_shards": round(r1), "20_shards": round(r10)}
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
