"""The eval stage beyond retrieval: zero-shot classification (``eval zeroshot``) and compositional hard negatives
(``eval compositional``) of every model the stage loads, on ``data.zeroshot`` / ``data.compositional`` or the
synthetic world's sets. Per model and fine-tuning seed: ``zeroshot/<task>/<measure>``, their mean over tasks
``zeroshot/<measure>`` (``acc5`` over the tasks with >= 5 classes), ``compositional/<category>`` and
``compositional/mean``; and the per-sample hits (top-1 right, pair right) for the report's bootstrap CIs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe

MEASURES = ("acc1", "acc5", "mean_per_class_recall")


def zeroshot_sets(r: Recipe, world: Path) -> dict[str, str]:
    """Task name -> classification folder: ``data.zeroshot``, else the world's tasks (none when turned off)."""
    if not r.eval.zeroshot:
        return {}
    if r.data.zeroshot:
        return dict(r.data.zeroshot)
    root = world / "zeroshot"
    return {d.name: str(d) for d in sorted(root.iterdir()) if d.is_dir()} if r.world.enabled and root.is_dir() else {}


def compositional_set(r: Recipe, world: Path) -> str:
    """The SugarCrepe folder: ``data.compositional``, else the world's ('' when there is none or it is off)."""
    if not r.eval.compositional:
        return ""
    comp = world / "compositional"
    return r.data.compositional or (str(comp) if r.world.enabled and comp.is_dir() else "")


def load_beyond_sets(r: Recipe, world: Path) -> tuple[dict, dict]:
    """The classification sets and SugarCrepe pairs the stage evaluates (read and checked once, before any model);
    ``world``: the run's world folder."""
    from halsift.corpus.classification import read_classification
    from halsift.corpus.sugarcrepe import read_sugarcrepe

    tasks = {name: read_classification(path) for name, path in zeroshot_sets(r, world).items()}
    comp = compositional_set(r, world)
    return tasks, (read_sugarcrepe(comp) if comp else {})


def evaluate_beyond(model, preprocess, tokenizer, tasks: dict, pairs: dict, device, batch_size: int,
                    precision: str) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """One model's metrics (see the module docstring) and hits (``zeroshot/<task>``, ``compositional/<cat>``)."""
    from halsift.eval.runs.compositional import evaluate_compositional
    from halsift.eval.runs.zeroshot import evaluate_zeroshot

    out: dict[str, float] = {}
    hits: dict[str, np.ndarray] = {}
    for name, cset in tasks.items():
        m, logits, target = evaluate_zeroshot(model, preprocess, tokenizer, cset, device, batch_size, precision,
                                              return_logits=True)
        out |= {f"zeroshot/{name}/{k}": m[f"zeroshot/{k}"] for k in MEASURES}
        hits[f"zeroshot/{name}"] = logits.argmax(axis=1) == target
    for k in MEASURES:
        vals = [out[f"zeroshot/{t}/{k}"] for t in tasks if np.isfinite(out[f"zeroshot/{t}/{k}"])]
        if vals:
            out[f"zeroshot/{k}"] = float(np.mean(vals))
    if pairs:
        m, correct = evaluate_compositional(model, preprocess, tokenizer, pairs, device, batch_size, precision,
                                            return_correct=True)
        out |= {k: v for k, v in m.items() if k != "compositional/pairs"}
        hits |= {f"compositional/{c}": v for c, v in correct.items()}
    return out, hits


def hits_key(model: str, seed_index: int, name: str) -> str:
    """Name of one model's per-sample hits in ``beyond_hits.npz``:
    ``<model>/<seed_index>/<zeroshot|compositional>/<set>``."""
    return f"{model}/{seed_index}/{name}"


def write_beyond(out_dir: Path, results: dict[str, list[dict]], hits: dict[str, np.ndarray]) -> None:
    """``beyond.json`` ({model: [metrics per fine-tuning seed]}) and ``beyond_hits.npz``."""
    from halsift.corpus.shards import write_json_atomic
    from halsift.eval.metrics.retrieval import write_ranks

    write_json_atomic(out_dir / "beyond.json", results)
    if hits:
        write_ranks(out_dir / "beyond_hits.npz", hits)
