"""The compare report beyond retrieval: zero-shot classification and compositional (SugarCrepe) accuracy per filter,
each filter's gain over ``random`` with a 95% CI (paired bootstrap over the evaluation images / pairs), a markdown
section and ``gain_over_random.png``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from halsift.eval.metrics.filter_delta import bootstrap_draws

REFERENCE = "random"
# measure -> (label, the hits group whose per-sample hits give its CI, or None)
MEASURES = {"zeroshot/acc1": ("zero-shot top-1", "zeroshot"),
            "zeroshot/mean_per_class_recall": ("zero-shot mean per-class recall", None),
            "compositional/mean": ("compositional mean", "compositional")}


def _mean_std(values: Sequence) -> tuple[float, float]:
    arr = np.asarray([v for v in values if isinstance(v, (int, float)) and np.isfinite(v)], dtype=float)
    if not arr.size:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def _mean_hits(hits: Mapping[str, np.ndarray], model: str, n_seeds: int, group: str) -> dict[str, np.ndarray]:
    """Per set of ``group``: the model's per-sample hits averaged over its seeds ({} when a seed lacks them)."""
    prefix = f"{model}/0/{group}/"
    sets = [k[len(prefix):] for k in hits if k.startswith(prefix)]
    out = {}
    for s in sets:
        keys = [f"{model}/{i}/{group}/{s}" for i in range(n_seeds)]
        if all(k in hits for k in keys) and len({len(hits[k]) for k in keys}) == 1:
            out[s] = np.mean([np.asarray(hits[k], dtype=float) for k in keys], axis=0)
    return out


def bootstrap_gain(hits: Mapping[str, np.ndarray], a: tuple[str, int], b: tuple[str, int], group: str,
                   n_boot: int = 1000, seed: int = 0) -> np.ndarray | None:
    """Replicates of (mean over sets of accuracy of ``a``) - (same of ``b``), in points, paired: each replicate
    resamples each set's samples with replacement, the same draw for both models. None without hits."""
    ha, hb = _mean_hits(hits, *a, group), _mean_hits(hits, *b, group)
    sets = sorted(s for s in ha if s in hb and len(ha[s]) == len(hb[s]) and len(ha[s]))
    if not sets or len(sets) != len(ha):
        return None
    total = np.zeros(n_boot)
    for i, s in enumerate(sets):
        w = bootstrap_draws(len(ha[s]), n_boot, seed + i)
        total += 100.0 * (w @ (ha[s] - hb[s])) / len(ha[s])
    return total / len(sets)


def add_beyond(rows: list[dict], beyond: Mapping[str, list[dict]], hits: Mapping[str, np.ndarray] | None = None,
               n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> list[str]:
    """Add every beyond-retrieval measure (mean, ``/std`` over seeds) to the rows, and for :data:`MEASURES`
    ``delta_random/<measure>`` with ``/ci_low`` ``/ci_high`` (NaN without hits); returns the measure keys."""
    keys = sorted({k for runs in beyond.values() for run in runs for k in run})
    if not keys:
        return []
    for row in rows:
        runs = beyond.get(row["filter"], [])
        for k in keys:
            row[k], row[f"{k}/std"] = _mean_std([run.get(k) for run in runs])
    base = next((r for r in rows if r["filter"] == REFERENCE), None)
    q = (100 * (1 - level) / 2, 100 * (1 + level) / 2)
    for row in rows:
        for k, (_, group) in MEASURES.items():
            if k not in keys:
                continue
            d = row[k] - base[k] if base is not None and row is not base else float("nan")
            lo = hi = float("nan")
            if hits and group and base is not None and row is not base and np.isfinite(d):
                reps = bootstrap_gain(hits, (row["filter"], row["seeds"]), (REFERENCE, base["seeds"]), group,
                                      n_boot, seed)
                if reps is not None:
                    lo, hi = (float(x) for x in np.percentile(reps, q))
            row[f"delta_random/{k}"], row[f"delta_random/{k}/ci_low"], row[f"delta_random/{k}/ci_high"] = d, lo, hi
    return keys


def beyond_keys(rows: list[dict]) -> list[str]:
    """The beyond-retrieval measures the rows carry (what :func:`add_beyond` added)."""
    return sorted({k for r in rows for k in r if k.startswith(("zeroshot/", "compositional/"))
                   and not k.endswith("/std")})


def _cell(row: dict, k: str) -> str:
    v, sd = row.get(k, float("nan")), row.get(f"{k}/std", float("nan"))
    if not np.isfinite(v):
        return "–"
    return f"{v:.1f} ± {sd:.1f}" if np.isfinite(sd) and sd > 0 else f"{v:.1f}"


def _delta(row: dict, k: str) -> str:
    d = row.get(f"delta_random/{k}", float("nan"))
    if not np.isfinite(d):
        return "–"
    lo, hi = row[f"delta_random/{k}/ci_low"], row[f"delta_random/{k}/ci_high"]
    return f"{d:+.1f} [{lo:+.1f}, {hi:+.1f}]" if np.isfinite(lo) else f"{d:+.1f}"


def beyond_markdown(rows: list[dict], keys: Sequence[str], n_boot: int = 1000) -> str:
    """The "Beyond retrieval" section: per filter, each zero-shot task's top-1 and their mean, mean per-class
    recall, each SugarCrepe category and their mean, the gains over random with 95% CIs; and who bought what."""
    if not keys or not rows:
        return ""
    tasks = [k for k in keys if k.startswith("zeroshot/") and k.endswith("/acc1") and k.count("/") == 2]
    cats = [k for k in keys if k.startswith("compositional/") and k != "compositional/mean"]
    head = ["Filter", *[f"zs {k.split('/')[1]}" for k in tasks]]
    cols = list(tasks)
    for k in ("zeroshot/acc1", "zeroshot/mean_per_class_recall"):
        if k in keys:
            head.append(MEASURES[k][0])
            cols.append(k)
    if "zeroshot/acc1" in keys:
        head.append("Δ zero-shot top-1 vs random")
    head += [c.split("/", 1)[1].replace("_", "-") for c in cats]
    cols += cats
    if "compositional/mean" in keys:
        head += ["compositional mean", "Δ compositional vs random"]
    lines = ["## Beyond retrieval: zero-shot classification and compositional hard negatives", "",
             "Zero-shot: top-1 accuracy per task (CLIP_benchmark's classifier and metrics) and the mean over tasks; "
             "compositional: SugarCrepe accuracy (true caption scored above its hard negative; chance 50) per "
             f"category and the mean over categories. 0–100, mean ± std over fine-tuning seeds; Δ vs random with "
             f"the 95% CI of a paired bootstrap over the evaluation images / pairs ({n_boot} replicates).", "",
             "| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for row in rows:
        cells = [row["filter"]]
        for k in cols:
            cells.append(_cell(row, k))
            if k == "zeroshot/mean_per_class_recall" or (k == "zeroshot/acc1" and
                                                            "zeroshot/mean_per_class_recall" not in keys):
                cells.append(_delta(row, "zeroshot/acc1"))
        if "compositional/mean" in keys:
            cells += [_cell(row, "compositional/mean"), _delta(row, "compositional/mean")]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *[s for s in (_verdict(rows, k) for k in ("compositional/mean", "zeroshot/acc1")) if s], ""]
    return "\n".join(lines)


def _verdict(rows: list[dict], k: str) -> str:
    """One sentence: which filters' gain over random on ``k`` has a 95% CI above 0, which below."""
    if not any(np.isfinite(r.get(f"delta_random/{k}/ci_low", float("nan"))) for r in rows):
        return ""
    up = [r["filter"] for r in rows if r.get(f"delta_random/{k}/ci_low", float("nan")) > 0]
    down = [r["filter"] for r in rows if r.get(f"delta_random/{k}/ci_high", float("nan")) < 0]
    label = MEASURES[k][0]
    say = (lambda ns: ", ".join(f"`{n}`" for n in ns) if ns else "none")
    return (f"{label[0].upper() + label[1:]}: 95% CI of the gain over random above 0 for {say(up)}; "
            f"below 0 for {say(down)}.")


def plot_gain_over_random(rows: list[dict], out: Path, k: int = 5) -> Path | None:
    """``gain_over_random.png``: per filter, its gain over random on R@k and on each measure of :data:`MEASURES`
    (error bars: 95% CIs where there are hits, else none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measures = [(f"r@{k}", f"R@{k}", f"delta_random/r@{k}")]
    measures += [(m, label + ("" if group else " (no CI)"), f"delta_random/{m}")
                 for m, (label, group) in MEASURES.items()
                 if any(np.isfinite(r.get(f"delta_random/{m}", float("nan"))) for r in rows)]
    shown = [r for r in rows if r["filter"] != REFERENCE]
    path = out / "gain_over_random.png"
    if len(measures) < 2 or not shown:
        path.unlink(missing_ok=True)  # a rerun without these measures leaves no stale plot
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(shown) * len(measures) / 2), 3.8))
    width = 0.8 / len(measures)
    x = np.arange(len(shown))
    for i, (m, label, key) in enumerate(measures):
        y = np.array([r.get(key, np.nan) for r in shown], dtype=float)
        lo = np.array([r.get(f"{key}/ci_low" if m != f"r@{k}" else "delta_random/ci_low", np.nan) for r in shown])
        hi = np.array([r.get(f"{key}/ci_high" if m != f"r@{k}" else "delta_random/ci_high", np.nan) for r in shown])
        err = np.where(np.isfinite(lo) & np.isfinite(hi), np.abs(np.stack([y - lo, hi - y])), 0.0)
        ax.bar(x + i * width, np.nan_to_num(y), width, yerr=err if err.any() else None, capsize=2, label=label)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xticks(x + width * (len(measures) - 1) / 2, [r["filter"] for r in shown], rotation=20)
    ax.set_ylabel("gain over random (points)")
    ax.set_title("What each filter bought over random selection (95% CIs)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
