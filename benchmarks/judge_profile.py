"""Where the ``vlm`` judge's time goes: host-side processor, vision tower, prefix forward, per-sentence
continuations (and the cache copy), scoring readout, per judge path, at several sentences per caption.

    python benchmarks/judge_profile.py --out /tmp/jp                          # GPU: Qwen2-VL-2B shape, 448 px
    OMP_NUM_THREADS=1 python benchmarks/judge_profile.py --size tiny --device cpu --out /tmp/jp   # CPU, seconds

``--size 2b`` (the default) is the Qwen2-VL-2B architecture with random weights (``judge_throughput.build``);
``--size tiny`` the tiny random Qwen2-VL of the tests. Each stage is timed with ``torch.cuda.synchronize()`` +
``perf_counter`` around it (hooks on the vision tower and the model, wrappers on the judge's calls), summed over
the batches of one pass over all captions; nested stages are reported both whole and net of what they contain
(``prefix_lm`` = prefix forward minus vision tower). A second, uninstrumented pass gives the plain device time.
``torch.profiler`` then records one batch per path: the top 25 ops by self CUDA time and by self CPU time go to
``profile_<path>_s<N>.txt``. Figures go to ``judge_profile.json`` after every measured unit (a stopped run keeps
what it measured), the tables to ``judge_profile.txt``. ``--time-limit`` (seconds, default 150) skips units that
would start after it. Prints numbers; never passes or fails on time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from judge_throughput import build, make_items  # noqa: E402

# reuse / plain: today's logits paths (image processor on the host); packed: the default path
PATHS = {"packed": dict(mode="logits", pack=True),
         "reuse": dict(mode="logits", reuse_prefix=True, pack=False, preprocess="cpu"),
         "plain": dict(mode="logits", reuse_prefix=False, preprocess="cpu")}


class Stages:
    """Seconds per named stage, summed; ``sync`` runs before every clock read (a CUDA sync on GPU)."""

    def __init__(self, sync) -> None:
        self.sync, self.total, self.calls, self.on = sync, defaultdict(float), defaultdict(int), True
        self._open: dict[str, float] = {}

    def start(self, name: str) -> None:
        if self.on:
            self.sync()
            self._open[name] = time.perf_counter()

    def stop(self, name: str) -> None:
        if self.on and name in self._open:
            self.sync()
            self.total[name] += time.perf_counter() - self._open.pop(name)
            self.calls[name] += 1

    @contextmanager
    def stage(self, name: str):
        self.start(name)
        try:
            yield
        finally:
            self.stop(name)

    def wrap(self, obj, attr: str, name: str) -> None:
        """Time every call of ``obj.attr`` (an instance attribute shadows the method)."""
        fn = getattr(obj, attr)

        def timed(*a, **kw):
            with self.stage(name):
                return fn(*a, **kw)

        setattr(obj, attr, timed)

    def hook(self, module, name: str) -> list:
        """Time every forward of ``module`` (pre/post forward hooks); returns the handles."""
        return [module.register_forward_pre_hook(lambda m, a: self.start(name)),
                module.register_forward_hook(lambda m, a, o: self.stop(name))]

    def reset(self) -> None:
        self.total.clear()
        self.calls.clear()
        self._open.clear()


def vision_module(model):
    inner = getattr(model, "model", model)
    for name in ("visual", "vision_tower", "vision_model"):
        if getattr(inner, name, None) is not None:
            return getattr(inner, name)
    return None


def instrument(det, st: Stages) -> list:
    """Wrap the judge's calls of ``det`` and hook its model; returns the hook handles."""
    judge = det.judge
    st.wrap(judge, "encode_prefix", "prefix_forward")
    st.wrap(judge, "full_batch", "full_batch_collate")
    st.wrap(det, "_scores_from_logits", "readout")
    cont = judge.continue_prefix

    def continue_prefix(prefix, *a, **kw):  # the cache copy (row gather) is the first thing it does
        if not getattr(prefix.cache, "_timed", False):
            st.wrap(prefix.cache, "reorder_cache", "cache_gather")
            prefix.cache._timed = True
        with st.stage("continuations"):
            return cont(prefix, *a, **kw)

    judge.continue_prefix = continue_prefix
    st.wrap(judge, "packed_logits", "packed_forward")
    st.wrap(judge, "resolve_images", "image_processor_device")
    handles = st.hook(det.model, "model_forward")
    vis = vision_module(det.model)
    if vis is not None:
        handles += st.hook(vis, "vision_tower")
    return handles


def host_pass(det, items, bs: int, processor) -> tuple[list, dict]:
    """``det.prepare`` per batch, split into the prefix features (image processor + head tokens), the
    continuation tokens, and separately the image processor alone on the same (capped) images."""
    from halsift.filtering.detectors.base import image_group

    st = Stages(lambda: None)
    st.wrap(det, "prefix_inputs", "prefix_features")
    st.wrap(det.judge, "deferred_features", "prefix_features")
    st.wrap(det, "continuations", "continuation_tokenize")
    prepared = []
    for s in range(0, len(items), bs):
        with st.stage("prepare_total"):
            prepared.append(det.prepare(items[s:s + bs]))
    for obj, name in ((det, "prefix_inputs"), (det.judge, "deferred_features"), (det, "continuations")):
        delattr(obj, name)
    images = list({image_group(it): det.fit_image(it.image) for it in items}.values())
    t = time.perf_counter()
    for s in range(0, len(images), bs):
        processor.image_processor(images=images[s:s + bs], return_tensors="pt")
    st.total["image_processor_only"] = time.perf_counter() - t
    return prepared, dict(st.total)


def device_pass(det, items, bs: int, prepared: list, sync) -> float:
    sync()
    t = time.perf_counter()
    for k, s in enumerate(range(0, len(items), bs)):
        det.score_prepared(items[s:s + bs], prepared[k])
    sync()
    return time.perf_counter() - t


def profile_table(det, items, bs: int, prepared: list, cuda: bool) -> str:
    import torch
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        det.score_prepared(items[:bs], prepared[0])
        if cuda:
            torch.cuda.synchronize()
    ka = prof.key_averages()
    out = []
    if cuda:
        out += ["# top 25 by self CUDA time", ka.table(sort_by="self_cuda_time_total", row_limit=25)]
    out += ["# top 25 by self CPU time", ka.table(sort_by="self_cpu_time_total", row_limit=25)]
    return "\n".join(out)


def net(stages: dict) -> dict:
    """Stage times with nested stages subtracted from the ones that hold them."""
    g = lambda k: stages.get(k, 0.0)  # noqa: E731
    out = {"vision_tower": g("vision_tower"), "cache_gather": g("cache_gather"), "readout": g("readout"),
           "full_batch_collate": g("full_batch_collate"), "image_processor_device": g("image_processor_device")}
    if "prefix_forward" in stages:
        out["prefix_lm"] = g("prefix_forward") - g("vision_tower")
        out["continuations_forward"] = g("continuations") - g("cache_gather")
    elif "packed_forward" in stages:
        out["packed_lm"] = g("packed_forward") - g("vision_tower")
    else:
        out["lm_forward"] = g("model_forward") - g("vision_tower")
    return {k: round(v, 5) for k, v in out.items()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="2b", choices=["2b", "tiny"], help="2b: Qwen2-VL-2B config; tiny: test model")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on CPU by default")
    ap.add_argument("--image-size", type=int, default=None, help="default 448 (2b) / 112 (tiny)")
    ap.add_argument("--captions", type=int, default=None, help="default 64 (2b) / 8 (tiny)")
    ap.add_argument("--sentences", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--batch-size", type=int, default=64, help="sentences per score_batch call")
    ap.add_argument("--paths", nargs="+", default=None, help=f"judge paths (default: all of {list(PATHS)})")
    ap.add_argument("--time-limit", type=float, default=150.0, help="seconds; later units are skipped")
    ap.add_argument("--no-profiler", action="store_true")
    ap.add_argument("--out", required=True, help="folder for judge_profile.json / .txt and the profiler tables")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    import torch

    from halsift.filtering.detectors.vlm import VlmDetector

    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    cuda = device.startswith("cuda")
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    tiny = args.size == "tiny"
    image_size = args.image_size or (112 if tiny else 448)
    captions = args.captions or (8 if tiny else 64)
    paths = args.paths or list(PATHS)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model, processor = build("qwen2-vl" if tiny else "qwen2-vl-2b-config", "tiny", image_size, device, dtype)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    res: dict = {"size": args.size, "device": device, "dtype": dtype, "image_size": image_size,
                 "captions": captions, "batch_size": args.batch_size, "threads": torch.get_num_threads(),
                 "torch": torch.__version__, "build_s": round(time.perf_counter() - t0, 2), "units": {}}
    if cuda:
        res["gpu"] = torch.cuda.get_device_name()
    lines: list[str] = []

    def save() -> None:
        (out / "judge_profile.json").write_text(json.dumps(res, indent=1))
        (out / "judge_profile.txt").write_text("\n".join(lines) + "\n")

    save()
    for n_sent in args.sentences:
        items = make_items(captions, n_sent, image_size)
        for path in paths:
            unit = f"{path}/s{n_sent}"
            if time.perf_counter() - t0 > args.time_limit:
                res["units"][unit] = {"skipped": f"past --time-limit {args.time_limit:g} s"}
                save()
                continue
            det = VlmDetector.from_model(model, processor, batch_size=args.batch_size, **PATHS[path])
            det.score_batch(items[:args.batch_size])  # warm-up
            prepared, host = host_pass(det, items, args.batch_size, processor)
            plain = device_pass(det, items, args.batch_size, prepared, sync)  # before any wrapper
            st = Stages(sync)
            handles = instrument(det, st)
            instrumented = device_pass(det, items, args.batch_size, prepared, sync)
            stages = dict(st.total)
            st.on = False
            for h in handles:
                h.remove()
            n = len(items)
            row = {"sentences": n, "distinct_images": captions,
                   "host_s": {k: round(v, 5) for k, v in host.items()},
                   "device_plain_s": round(plain, 5), "device_instrumented_s": round(instrumented, 5),
                   "stages_s": {k: round(v, 5) for k, v in stages.items()}, "stages_net_s": net(stages),
                   "stage_calls": dict(st.calls),
                   "device_sentences_per_s": round(n / plain, 2),
                   "end_to_end_sentences_per_s": round(n / (plain + host["prepare_total"]), 2),
                   "host_ms_per_sentence": round(1000 * host["prepare_total"] / n, 3)}
            acc = sum(v for k, v in row["stages_net_s"].items())
            row["stages_net_s"]["other"] = round(instrumented - acc, 5)
            pre = prepared[0]
            if "prefixes" in pre:
                row["prefix_tokens"] = int(pre["prefixes"][0]["input_ids"].shape[1])
                row["continuation_tokens_mean"] = round(sum(len(c) for p in prepared for c in p["conts"]) / n, 1)
            if not args.no_profiler:
                table = profile_table(det, items, args.batch_size, prepared, cuda)
                (out / f"profile_{path}_s{n_sent}.txt").write_text(table + "\n")
            res["units"][unit] = row
            if cuda:
                res["gpu_peak_mem_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
            res["elapsed_s"] = round(time.perf_counter() - t0, 1)
            lines.append(f"{unit}: device {row['device_sentences_per_s']}/s, end to end "
                         f"{row['end_to_end_sentences_per_s']}/s; host {row['host_s']}; net stages "
                         f"{row['stages_net_s']}")
            print(lines[-1], flush=True)
            save()
    res["elapsed_s"] = round(time.perf_counter() - t0, 1)
    save()
    return res


if __name__ == "__main__":
    main()
