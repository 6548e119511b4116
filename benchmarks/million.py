"""A million captions end to end (issue 42): ``basic`` -> ``dedup`` -> ``score`` (2 tasks) -> ``select --resumable``
-> the report, each stage a separate ``halsift`` process timed for wall time and peak RSS, at each size of
``--sizes``, with the growth from the smallest size to the largest (time should grow with the data, peak memory
should stay flat).

    python benchmarks/million.py                    # 100k and 1M (roughly an hour on 2 cores; ~8 GB disk at 1M)
    python benchmarks/million.py --json million.json --work /data/million
    python benchmarks/million.py --samples 2000 --check --json smoke.json   # one size: the CI smoke run

The corpus: a small pool of the synthetic world's images and captions (``--pool``, 2-4 sentences each) under N new
keys. Each key's image is its pool image blended with a key-seeded 8x8 colour pattern (``PATTERN_ALPHA``), so that no
two keys are exact or near duplicates under dedup's tests (sha256; phash within 4 bits *and* 12x12 thumbnail cosine
>= 0.97; thumbnail cosine >= 0.92 to a crop variant of a retrieval image). On top it plants ``--plant`` of each:
exact copies (another key's image bytes), near copies (another key's JPEG decoded and saved again at quality
``NEAR_QUALITY``) and leaks (a retrieval image cut by up to 5% per side, resized to the corpus size); originals lie
in the first half of the corpus and their copies in the second, so dedup lists the copy. ``--check`` exits 1
unless dedup lists exactly the planted copies, each with its original (or retrieval image), and nothing else. The
json of each key records an ``original_width``/``original_height`` (as img2dataset does), short sides from 128 to
639 px, so DataComp's size rule removes about 14%.

Stages (``HALSIFT_QUIET=1``, ``OMP_NUM_THREADS=1`` unless set):

1. ``basic`` (``--languages en de fr es``: every language of lingua takes ~1 GB and ~200 captions/s, docs/curation.md);
2. ``dedup --against RETRIEVAL`` (no embeddings: the thumbnail/phash path);
3. ``score --detector clip:arch=halsift-tiny,pretrained=random --num-tasks 2 --task-index I``, both at once;
4. ``select --resumable --keep 0.2 --exclude DEDUP --fields BASIC --where pass_datacomp``;
5. ``report``: the same select command with ``--html`` run again: it finds the selection complete and writes
   ``index.html`` (the kept-set statistics come from its manifest).

Wall time is seen from here; peak RSS and CPU seconds per process come from ``os.wait4`` (the process and the
children it waited for). Never passes or fails on time.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DETECTOR = "clip:arch=halsift-tiny,pretrained=random"
STAGES = ("basic", "dedup", "score", "select", "report")
PATTERN = 8  # the per-key pattern: PATTERN x PATTERN blocks of colour
PATTERN_ALPHA = 0.6  # its weight in the blend with the pool image
QUALITY = 90  # JPEG quality of every key's image
NEAR_QUALITY = 85  # a planted near copy: the original JPEG decoded and saved again at this quality
LEAK_CROP = 0.05  # a planted leak: at most this share of each side of the retrieval image cut


@dataclass(frozen=True)
class Plan:
    """Where the planted copies go: corpus position -> original position (exact, near) or retrieval index (leaks)."""

    n: int
    exact: dict[int, int]
    near: dict[int, int]
    leaks: dict[int, int]


def make_plan(n: int, plant: int, retrieval: int, seed: int) -> Plan:
    """``plant`` of each kind; originals in the first half, copies in the second (so the copy comes later)."""
    half = n // 2
    if 2 * plant > half or 3 * plant > n - half:
        raise SystemExit(f"--plant {plant}: too many for {n} samples")
    if plant > retrieval:
        raise SystemExit(f"--plant {plant}: more leaks than --retrieval images ({retrieval})")
    rng = np.random.default_rng([seed, 42])
    orig = rng.choice(half, 2 * plant, replace=False).tolist()
    pos = (half + rng.choice(n - half, 3 * plant, replace=False)).tolist()
    refs = rng.choice(retrieval, plant, replace=False).tolist()
    return Plan(n, dict(zip(pos[:plant], orig[:plant])), dict(zip(pos[plant:2 * plant], orig[plant:])),
                dict(zip(pos[2 * plant:], refs)))


def key_of(i: int) -> str:
    return f"m{i:08d}"


# ------------------------------------------------------------------------------------------------ the corpus
class Pool:
    """The world's images (RGB arrays) and captions that every key draws from, and its retrieval images."""

    def __init__(self, world: Path, image_size: int) -> None:
        from PIL import Image

        from halsift.corpus.shards import iter_samples

        self.size = image_size
        self.images, self.captions, self.metas = [], [], []
        for s in iter_samples(world / "corpus"):
            img = Image.open(io.BytesIO(s.image)).convert("RGB").resize((image_size, image_size), Image.BILINEAR)
            self.images.append(np.asarray(img, np.uint8))
            self.captions.append(s.caption)
            self.metas.append({"captioner": s.captioner, "source": "i2t", "sentences": s.meta["sentences"]})
        rows = [json.loads(line) for line in (world / "retrieval" / "retrieval.jsonl").read_text().splitlines()
                if line.strip()]
        self.retrieval = [(r["image"], (world / "retrieval" / r["image"]).read_bytes()) for r in rows]

    def pixels(self, seed: int, i: int) -> np.ndarray:
        """Key ``i``'s image: its pool image blended with a pattern seeded by (seed, i)."""
        base = self.images[i % len(self.images)].astype(np.float32)
        h = hashlib.shake_256(f"{seed}/{i}".encode()).digest(PATTERN * PATTERN * 3)
        pat = np.frombuffer(h, np.uint8).reshape(PATTERN, PATTERN, 3).astype(np.float32)
        rep = -(-self.size // PATTERN)
        pat = np.repeat(np.repeat(pat, rep, 0), rep, 1)[:self.size, :self.size]
        return ((1 - PATTERN_ALPHA) * base + PATTERN_ALPHA * pat + 0.5).astype(np.uint8)

    def leak(self, seed: int, pos: int, r: int) -> bytes:
        """Retrieval image ``r`` cut by up to :data:`LEAK_CROP` per side, resized to the corpus size."""
        from PIL import Image

        img = Image.open(io.BytesIO(self.retrieval[r][1])).convert("RGB")
        w, h = img.size
        rng = np.random.default_rng([seed, pos, 7])
        cut = rng.uniform(0, LEAK_CROP, 4)
        box = (round(cut[0] * w), round(cut[1] * h), w - round(cut[2] * w), h - round(cut[3] * h))
        return jpeg(np.asarray(img.crop(box).resize((self.size, self.size), Image.BICUBIC)), QUALITY)


def jpeg(arr: np.ndarray, quality: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


def image_of(pool: Pool, plan: Plan, seed: int, i: int) -> bytes:
    if i in plan.exact:
        return jpeg(pool.pixels(seed, plan.exact[i]), QUALITY)  # the original's bytes, exactly
    if i in plan.near:
        from PIL import Image

        original = Image.open(io.BytesIO(jpeg(pool.pixels(seed, plan.near[i]), QUALITY))).convert("RGB")
        return jpeg(np.asarray(original), NEAR_QUALITY)
    if i in plan.leaks:
        return pool.leak(seed, i, plan.leaks[i])
    return jpeg(pool.pixels(seed, i), QUALITY)


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = len(data), 0, 0o644
    tar.addfile(info, io.BytesIO(data))


_POOL: Pool | None = None


def _init(pool: Pool) -> None:
    global _POOL
    _POOL = pool


def write_shard(args: tuple) -> tuple[str, int]:
    """Write shard ``index`` (keys ``lo``..``hi``-1) to ``out``; returns its name and sample count."""
    out, index, lo, hi, plan, seed = args
    pool = _POOL
    name = f"{index:06d}.tar"
    tmp = out / f".{name}.tmp"
    with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tar:
        for i in range(lo, hi):
            key = key_of(i)
            j = i % len(pool.captions)
            short = 128 + int.from_bytes(hashlib.blake2b(f"{seed}/size/{i}".encode(), digest_size=4).digest()) % 512
            meta = {**pool.metas[j], "key": key, "original_width": short * 4 // 3, "original_height": short}
            _member(tar, f"{key}.jpg", image_of(pool, plan, seed, i))
            _member(tar, f"{key}.txt", pool.captions[j].encode())
            _member(tar, f"{key}.json", json.dumps(meta, sort_keys=True).encode())
    os.replace(tmp, out / name)
    return name, hi - lo


def build_corpus(world: Path, out: Path, n: int, per_shard: int, plan: Plan, seed: int, image_size: int,
                 workers: int) -> float:
    """Write the N-key corpus as shards of ``per_shard`` (``workers`` processes); returns seconds taken."""
    import multiprocessing as mp

    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    pool = Pool(world, image_size)
    jobs = [(out, s, lo, min(n, lo + per_shard), plan, seed) for s, lo in enumerate(range(0, n, per_shard))]
    if workers > 1:
        with mp.get_context("fork").Pool(workers, initializer=_init, initargs=(pool,)) as p:
            sizes = dict(p.imap_unordered(write_shard, jobs))
    else:
        _init(pool)
        sizes = dict(map(write_shard, jobs))
    (out / "sizes.json").write_text(json.dumps(dict(sorted(sizes.items())), indent=1))
    return time.perf_counter() - t0


def make_world(world: Path, pool: int, retrieval: int, seed: int) -> None:
    from halsift.synth.world import generate_world

    generate_world(world, images=pool, seed=seed, image_size=64, bench_images=0, retrieval_images=retrieval,
                   pretrain_images=0, t2i_prompts=0, zeroshot_images=0, compositional_images=0,
                   captioners=["share-sim"], corpus_sentences=(2, 4))


# ------------------------------------------------------------------------------------------------ measuring
def run_stage(name: str, argvs: list[list[str]], logs: Path, env: dict) -> dict:
    """Run ``argvs`` at once (one process each); wall time of the stage and per process, peak RSS, CPU seconds.
    Exits 2 with the log's tail when a process fails."""
    t0 = time.perf_counter()
    running = {}
    for j, argv in enumerate(argvs):
        log = open(logs / f"{name}-{j}.log", "wb")
        p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        running[p.pid] = (j, p, log, time.perf_counter())
    procs: list[dict] = [{}] * len(argvs)
    while running:
        pid, status, ru = os.wait4(-1, 0)
        if pid not in running:
            continue
        j, p, log, start = running.pop(pid)
        log.close()
        p.returncode = os.waitstatus_to_exitcode(status)
        procs[j] = {"argv": " ".join(argvs[j][3:]), "rc": p.returncode, "wall_s": round(time.perf_counter() - start, 2),
                    "peak_rss_mb": round(ru.ru_maxrss / 1024, 1), "cpu_s": round(ru.ru_utime + ru.ru_stime, 2)}
        if p.returncode != 0:
            tail = (logs / f"{name}-{j}.log").read_text(errors="replace")[-3000:]
            raise SystemExit(f"million: stage {name} failed (exit {p.returncode}): {procs[j]['argv']}\n{tail}")
    return {"wall_s": round(time.perf_counter() - t0, 2), "peak_rss_mb": max(p["peak_rss_mb"] for p in procs),
            "cpu_s": round(sum(p["cpu_s"] for p in procs), 2), "processes": procs}


def check_dedup(dedup: Path, plan: Plan, pool_retrieval: list) -> dict:
    """Planted vs found, per reason; ``all_found_exactly``: every planted copy listed with its original (or
    retrieval image) under its reason, and nothing else listed."""
    import pyarrow.parquet as pq

    rows = pq.read_table(dedup / "duplicates.parquet").to_pylist()
    found = {r: {x["key"]: x["matched"] for x in rows if x["reason"] == r} for r in ("exact", "near", "eval")}
    want = {"exact": {key_of(p): key_of(o) for p, o in plan.exact.items()},
            "near": {key_of(p): key_of(o) for p, o in plan.near.items()},
            "eval": {key_of(p): pool_retrieval[r][0] for p, r in plan.leaks.items()}}
    out = {r: {"planted": len(want[r]), "found": len(found[r]),
               "matched": sum(found[r].get(k) == v for k, v in want[r].items())} for r in want}
    planted = set().union(*want.values())
    out["other_listed"] = sum(x["key"] not in planted for x in rows)
    out["all_found_exactly"] = all(found[r] == want[r] for r in want) and out["other_listed"] == 0
    return out


def run_size(n: int, a: argparse.Namespace, root: Path, world: Path, pool_retrieval: list, env: dict) -> dict:
    work = root / f"n{n}"
    if work.exists():
        shutil.rmtree(work)
    logs = work / "logs"
    logs.mkdir(parents=True)
    plant = a.plant or max(10, min(100, n // 1000))
    plan = make_plan(n, plant, len(pool_retrieval), a.seed)
    per_shard = a.per_shard or max(250, min(10_000, -(-n // 8)))
    corpus = work / "corpus"
    build_s = build_corpus(world, corpus, n, per_shard, plan, a.seed, a.image_size, a.build_workers)
    shards = len(list(corpus.glob("*.tar")))
    print(f"N={n}: corpus of {shards} shards ({per_shard} per shard, {plant} planted of each kind) in {build_s:.1f} s",
          flush=True)
    hs = [sys.executable, "-m", "halsift.launch.cli"]
    d = {k: str(work / k) for k in ("basic", "dedup", "scores", "select")}
    select = [*hs, "select", "--scores", d["scores"], "--data", str(corpus), "--out", d["select"], "--resumable",
              "--keep", "0.2", "--exclude", d["dedup"], "--fields", d["basic"], "--where", "pass_datacomp",
              "--no-progress"]
    cmds = {
        "basic": [[*hs, "basic", "--data", str(corpus), "--out", d["basic"], "--languages", "en", "de", "fr", "es",
                   "--no-progress"]],
        "dedup": [[*hs, "dedup", "--data", str(corpus), "--out", d["dedup"], "--against",
                   str(world / "retrieval"), "--no-progress"]],
        "score": [[*hs, "score", "--detector", DETECTOR, "--data", str(corpus), "--out", d["scores"], "--device",
                   "cpu", "--batch-size", str(a.batch_size), "--no-progress", "--num-tasks", "2", "--task-index",
                   str(i)] for i in range(2)],
        "select": [select],
        "report": [[*select, "--html"]],
    }
    stages, dedup_check = {}, None
    for name in STAGES:
        stages[name] = run_stage(name, cmds[name], logs, env)
        s = stages[name]
        print(f"  {name:<7} {s['wall_s']:>9.1f} s  peak {s['peak_rss_mb']:>8.1f} MB  "
              f"({len(s['processes'])} process{'es' if len(s['processes']) > 1 else ''})", flush=True)
        if name == "dedup":
            dedup_check = check_dedup(work / "dedup", plan, pool_retrieval)
            print("  dedup found/planted: " + ", ".join(f"{r} {dedup_check[r]['matched']}/{dedup_check[r]['planted']}"
                                                        f" (listed {dedup_check[r]['found']})"
                                                        for r in ("exact", "near", "eval"))
                  + f", other listed {dedup_check['other_listed']}", flush=True)
    m = json.loads((work / "select" / "manifest.json").read_text())
    page = work / "select" / "index.html"
    kept = {"kept_units": m.get("kept_units"), "candidates": m.get("candidates"), "score_rows": m.get("score_rows"),
            "samples_written": m.get("samples_written"), "precision": m.get("precision"),
            "sentence_precision": m.get("sentence_precision"),
            "html_bytes": page.stat().st_size if page.exists() else None,
            "html_thumbnails": len(list((work / "select" / "samples").glob("*.jpg")))}
    dm = json.loads((work / "dedup" / "manifest.json").read_text())
    sm = json.loads((work / "scores" / "_manifest.json").read_text())
    inner = {"dedup_timing_s": dm.get("timing_s"), "dedup_pairs": dm.get("pairs"),
             "score_items": sm.get("sentences"), "select_wall_time_s": m.get("wall_time_s")}
    disk = sum(f.stat().st_size for f in work.rglob("*") if f.is_file())
    result = {"samples": n, "shards": shards, "per_shard": per_shard, "planted_each": plant,
              "build_s": round(build_s, 1),
              "stages": stages, "dedup": dedup_check, "kept": kept, "inside": inner, "disk_mb": round(disk / 2**20, 1)}
    if not a.keep_work:
        shutil.rmtree(work, ignore_errors=True)
    return result


def growth(small: dict, big: dict) -> dict:
    """Per stage: time and peak-RSS ratio of the largest size over the smallest."""
    out = {"samples_ratio": round(big["samples"] / small["samples"], 2)}
    for name in STAGES:
        a, b = small["stages"][name], big["stages"][name]
        out[name] = {"time_ratio": round(b["wall_s"] / max(a["wall_s"], 1e-9), 2),
                     "rss_ratio": round(b["peak_rss_mb"] / max(a["peak_rss_mb"], 1e-9), 2)}
    return out


def table(results: list[dict], grow: dict | None) -> str:
    head = f"{'stage / process':<34}" + "".join(f"{'N=' + str(r['samples']):>24}" for r in results)
    lines = [head, f"{'':<34}" + "".join(f"{'wall s':>12}{'peak MB':>12}" for _ in results)]
    for name in STAGES:
        lines.append(f"{name:<34}" + "".join(f"{r['stages'][name]['wall_s']:>12.1f}"
                                              f"{r['stages'][name]['peak_rss_mb']:>12.1f}" for r in results))
        if len(results[0]["stages"][name]["processes"]) > 1:
            for j in range(len(results[0]["stages"][name]["processes"])):
                lines.append(f"{'  process ' + str(j):<34}" + "".join(
                    f"{r['stages'][name]['processes'][j]['wall_s']:>12.1f}"
                    f"{r['stages'][name]['processes'][j]['peak_rss_mb']:>12.1f}" for r in results))
    if grow:
        lines.append(f"growth x{grow['samples_ratio']} samples: " + ", ".join(
            f"{s} time x{grow[s]['time_ratio']} RSS x{grow[s]['rss_ratio']}" for s in STAGES))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="corpus sizes to run")
    p.add_argument("--samples", type=int, help="run this one size only (replaces --sizes)")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--check", action="store_true", help="exit 1 unless dedup lists exactly the planted copies")
    p.add_argument("--work", help="working folder (default: a temporary one, removed at the end)")
    p.add_argument("--keep-work", action="store_true", help="keep each size's corpus and outputs")
    p.add_argument("--plant", type=int, default=0, help="planted exact copies, near copies and leaks, each "
                                                        "(default: N/1000 within 10..100)")
    p.add_argument("--pool", type=int, default=256, help="world images the keys draw from")
    p.add_argument("--retrieval", type=int, default=200, help="retrieval images (dedup --against)")
    p.add_argument("--per-shard", type=int, default=0, help="samples per shard (default N/8 within 250..10000)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--batch-size", type=int, default=64, help="score's --batch-size")
    p.add_argument("--build-workers", type=int, default=os.cpu_count() or 1, help="processes writing the corpus")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    sizes = [a.samples] if a.samples else sorted(a.sizes)
    if min(sizes) < 100:
        p.error("sizes: at least 100 samples")
    env = {**os.environ, "HALSIFT_QUIET": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    env.setdefault("OMP_NUM_THREADS", "1")
    root = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="halsift-million-"))
    root.mkdir(parents=True, exist_ok=True)
    world = root / "world"
    t0 = time.perf_counter()
    if not (world / "world.json").exists():
        make_world(world, a.pool, a.retrieval, a.seed)
    pool_retrieval = [(r["image"], None) for r in (json.loads(x) for x in
                                                   (world / "retrieval" / "retrieval.jsonl").read_text().splitlines()
                                                   if x.strip())]
    print(f"world ({a.pool} images, {a.retrieval} retrieval) in {time.perf_counter() - t0:.1f} s; "
          f"cpus={os.cpu_count()} load={os.getloadavg()[0]:.1f} OMP_NUM_THREADS={env['OMP_NUM_THREADS']}",
          flush=True)
    results = []
    try:
        for n in sizes:
            results.append(run_size(n, a, root, world, pool_retrieval, env))
    finally:
        if not a.work and not a.keep_work:
            shutil.rmtree(root, ignore_errors=True)
    grow = growth(results[0], results[-1]) if len(results) > 1 else None
    print(table(results, grow))
    for r in results:
        k = r["kept"]
        prec = k["precision"] or {}
        print(f"N={r['samples']}: kept {k['kept_units']} of {k['candidates']} units ({k['samples_written']} samples "
              f"written); precision {prec.get('input')} -> {prec.get('kept')}; index.html {k['html_bytes']} bytes, "
              f"{k['html_thumbnails']} thumbnails; {r['disk_mb']} MB on disk")
    doc = {"sizes": results, "growth": grow, "detector": DETECTOR, "cpus": os.cpu_count(),
           "load_at_end": os.getloadavg()[0], "omp_num_threads": env["OMP_NUM_THREADS"],
           "stages": list(STAGES)}
    if a.json:
        Path(a.json).write_text(json.dumps(doc, indent=1))
    exact = all(r["dedup"]["all_found_exactly"] for r in results)
    if a.check and not exact:
        print("million: dedup did not find exactly the planted duplicates and leaks", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
