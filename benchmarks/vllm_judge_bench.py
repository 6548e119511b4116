"""The ``vllm`` judge's figures, for ``judge_throughput.py --vllm`` and ``gpu_suite.py --vllm``: sentences/s of
``vllm:mode=yes_prob`` (and ``mode=prompt``) on a saved model folder, requests grouped by image (as the detector
submits them) vs shuffled across images, and vLLM's prefix-cache hit rate over the run. Each timed round scores
fresh images and sentences (a repeated round would be served from the caches). Needs vLLM and a CUDA device:
:func:`unavailable` says why not, and the callers skip with that message.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any


def unavailable() -> str | None:
    """Why the vLLM figures cannot be measured here (``None`` when they can)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return "vllm is not installed (pip install 'halsift[vllm]')"
    import torch

    if not torch.cuda.is_available():
        return "no CUDA device"
    return None


def cache_counters(llm: Any) -> tuple[float, float] | None:
    """vLLM's prefix-cache (queries, hits) token counters, or None where this vLLM does not expose them."""
    try:
        metrics = llm.get_metrics()
    except Exception:  # older vLLM (no get_metrics) or metrics disabled
        return None
    found = {}
    for m in metrics:
        for key in ("prefix_cache_queries", "prefix_cache_hits"):
            if getattr(m, "name", "").endswith(key):
                found[key] = float(getattr(m, "value", 0) or 0)
    return (found["prefix_cache_queries"], found["prefix_cache_hits"]) if len(found) == 2 else None


def _score(det: Any, items: Sequence, batch_size: int, shuffle: bool, seed: int) -> None:
    rng = random.Random(seed)
    for s in range(0, len(items), batch_size):
        batch = items[s:s + batch_size]
        prep = det.prepare(batch)
        if shuffle:  # requests in random order instead of grouped by image
            perm = list(range(len(prep["requests"])))
            rng.shuffle(perm)
            prep = {k: [v[i] for i in perm] for k, v in prep.items()}
        det.score_prepared(batch, prep)


def measure(model_dir: str, make_items: Callable[[int, int], list], sentences: Sequence[int], batch_size: int,
            repeats: int = 2, modes: Sequence[str] = ("yes_prob",), max_pixels: int = 0,
            max_model_len: int = 4096, gpu_memory_utilization: float = 0.85) -> dict:
    """Figures of the vllm detector on ``model_dir``; ``make_items(n_sentences, seed)`` gives fresh items."""
    from halsift.filtering.detectors.spec import load_detector

    res: dict = {}
    for mode in modes:
        det = load_detector(f"vllm:model={model_dir},mode={mode},max_pixels={max_pixels},"
                            f"max_model_len={max_model_len},gpu_memory_utilization={gpu_memory_utilization}")
        _score(det, make_items(sentences[0], 10_000), batch_size, False, 0)  # warm-up: compile, CUDA graphs
        for n in sentences:
            for order in ("grouped", "shuffled"):
                best, c0 = float("inf"), cache_counters(det.llm)
                total = 0
                for r in range(repeats):
                    items = make_items(n, 1000 * n + 10 * r + (order == "shuffled"))
                    t = time.perf_counter()
                    _score(det, items, batch_size, order == "shuffled", r)
                    best = min(best, time.perf_counter() - t)
                    total = len(items)
                c1 = cache_counters(det.llm)
                key = f"vllm/{mode}/s{n}/{order}"
                res[f"{key}/sentences_per_s"] = round(total / best, 2)
                if c0 is not None and c1 is not None and c1[0] > c0[0]:
                    res[f"{key}/prefix_cache_hit_rate"] = round((c1[1] - c0[1]) / (c1[0] - c0[0]), 4)
                print(f"vllm {mode} {n:2d} sentences/image {order}: {res[f'{key}/sentences_per_s']:.1f}/s  "
                      f"prefix-cache hits {res.get(f'{key}/prefix_cache_hit_rate', 'n/a')}", flush=True)
        res[f"vllm/{mode}/failed_requests"] = det.failed_requests
        del det
    return res


__all__ = ["cache_counters", "measure", "unavailable"]
