"""The compare-filters report: HalDec Table F (fine-tuned CLIP retrieval R@5 per filter) extended with each
filter's benchmark AUROC and the precision of what it kept, as markdown, metrics.json, plots and a wandb run."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def _kept_precision(manifest: Mapping) -> float | None:
    for key in ("precision", "kept_precision"):
        v = manifest.get(key)
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, Mapping):
            for sub in ("kept", "all", "overall"):
                if isinstance(v.get(sub), (int, float)):
                    return float(v[sub])
    return None


def _input_precision(manifests: Mapping[str, Mapping]) -> float | None:
    for m in manifests.values():
        for key in ("input_precision",):
            if isinstance(m.get(key), (int, float)):
                return float(m[key])
        prec = m.get("precision")
        if isinstance(prec, Mapping) and isinstance(prec.get("input"), (int, float)):
            return float(prec["input"])
    return None


def compare_table(retrieval: Mapping[str, list[dict]], bench: Mapping[str, float],
                  selections: Mapping[str, Mapping], sets: Sequence[str], k: int = 5,
                  filters: Sequence[str] | None = None) -> list[dict]:
    """One row per filter (``no-tune`` first): R@k per set and direction (mean, std over seeds), AUROC, precision."""
    rows = []
    names = [n for n in ("no-tune", "unfiltered") if n in retrieval] + list(filters or [])
    names += [n for n in retrieval if n not in names]
    for name in names:
        runs = retrieval.get(name, [])
        row: dict = {"filter": name, "seeds": len(runs)}
        for s in sets:
            for d in ("i2t", "t2i"):
                mean, std = _mean_std([run.get(f"{s}/{d}/r@{k}") for run in runs])
                row[f"{s}/{d}/r@{k}"] = mean
                row[f"{s}/{d}/r@{k}/std"] = std
        single = filters is not None and len(filters) == 1 and name == filters[0]
        auroc = bench.get(f"{name}/auroc/mean", bench.get("auroc/mean") if single else None)
        row["auroc/mean"] = float(auroc) if auroc is not None else float("nan")
        man = selections.get(name, {})
        prec = _kept_precision(man)
        row["kept_precision"] = prec if prec is not None else float("nan")
        kept = man.get("kept_units", man.get("kept"))
        row["kept"] = int(kept) if isinstance(kept, (int, float)) else None
        rows.append(row)
    return rows


def _fmt(v, std=None) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "–"
    return f"{v:.1f} ± {std:.1f}" if std is not None and np.isfinite(std) and std > 0 else f"{v:.1f}"


def render_markdown(title: str, rows: list[dict], sets: Sequence[str], input_precision: float | None,
                    k: int = 5, bench_split: str = "") -> str:
    if not rows:
        return f"# Report: {title}\n\nNo filters were compared in this run (no score/select/finetune stages).\n"
    head = ["Filter", *[f"{s} {d} R@{k}" for s in sets for d in ("i2t", "t2i")], "bench AUROC",
            "kept precision", "kept", "seeds"]
    lines = [f"# Compare filters: {title}", "",
             "Fine-tuned CLIP retrieval per filter (HalDec Table F), with each filter's sentence-level detection "
             f"AUROC on the benchmark{f' ({bench_split} split)' if bench_split else ''} and the precision "
             "(share of correct sentences) of what it kept. "
             "R@k on a 0–100 scale, mean ± std over fine-tuning seeds.", ""]
    if input_precision is not None:
        lines += [f"Precision of the unfiltered corpus: {100 * input_precision:.1f}%.", ""]
    lines += ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for row in rows:
        cells = [row["filter"]]
        for s in sets:
            for d in ("i2t", "t2i"):
                cells.append(_fmt(row[f"{s}/{d}/r@{k}"], row[f"{s}/{d}/r@{k}/std"]))
        prec = row["kept_precision"]
        cells += [_fmt(row["auroc/mean"]), _fmt(100 * prec if np.isfinite(prec) else prec),
                  str(row["kept"]) if row["kept"] is not None else "–", str(row["seeds"])]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Plots: `r_at_k.png` (R@k per filter), `auroc_vs_recall.png` (detector AUROC vs what its "
              "filter buys).", ""]
    return "\n".join(lines)


def plot_rows(rows: list[dict], sets: Sequence[str], out: Path, k: int = 5) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    if not rows:
        return paths
    names = [r["filter"] for r in rows]
    cols = [(s, d) for s in sets for d in ("i2t", "t2i")]
    fig, ax = plt.subplots(figsize=(max(5, 1.2 * len(names) * len(cols) / 2), 3.5))
    width = 0.8 / max(1, len(cols))
    x = np.arange(len(names))
    for i, (s, d) in enumerate(cols):
        means = [r[f"{s}/{d}/r@{k}"] for r in rows]
        stds = [r[f"{s}/{d}/r@{k}/std"] for r in rows]
        ax.bar(x + i * width, means, width, yerr=stds, label=f"{s} {d}", capsize=2)
    ax.set_xticks(x + width * (len(cols) - 1) / 2, names, rotation=20)
    ax.set_ylabel(f"R@{k}")
    ax.set_title("Fine-tuned CLIP retrieval by filter")
    ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "r_at_k.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    pts = [r for r in rows if np.isfinite(r["auroc/mean"])]
    if pts and sets:
        fig, ax = plt.subplots(figsize=(4.5, 3.5))
        for d, marker in (("i2t", "o"), ("t2i", "s")):
            ax.scatter([r["auroc/mean"] for r in pts], [r[f"{sets[0]}/{d}/r@{k}"] for r in pts], marker=marker,
                       label=d)
        for r in pts:
            ax.annotate(r["filter"], (r["auroc/mean"], r[f"{sets[0]}/i2t/r@{k}"]), fontsize=7)
        ax.set_xlabel("detector AUROC on the bench")
        ax.set_ylabel(f"{sets[0]} R@{k} after fine-tuning")
        ax.legend(fontsize=7)
        fig.tight_layout()
        paths.append(out / "auroc_vs_recall.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    return paths


def compare_filters_report(title: str, retrieval: Mapping[str, list[dict]], bench: Mapping[str, float],
                           selections: Mapping[str, Mapping], sets: Sequence[str], out_dir: str | os.PathLike,
                           wandb_mode: str = "offline", wandb_project: str = "halsift", k: int = 5,
                           filters: Sequence[str] | None = None,
                           extra_reports: Mapping[str, Path] | None = None, bench_split: str = "") -> dict:
    """Write ``metrics.json``, ``report.md``, plots and (unless disabled) an offline wandb run; returns metrics."""
    from halsift.corpus.shards import write_json_atomic

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = compare_table(retrieval, bench, selections, sets, k, filters)
    metrics = {f"{r['filter']}/{key}": v for r in rows for key, v in r.items()
               if key not in ("filter",) and isinstance(v, (int, float)) and np.isfinite(v)}
    write_json_atomic(out / "metrics.json", metrics)
    text = render_markdown(title, rows, sets, _input_precision(selections), k, bench_split)
    bench_report = Path(out_dir).parent / "eval" / "bench" / "report.md"
    links = ({"detection benchmark": bench_report} if bench_report.exists() else {}) | dict(extra_reports or {})
    if links:
        text += "\n## Other reports\n\n" + "".join(
            f"- {name}: `{os.path.relpath(path, out)}`\n" for name, path in links.items()) + "\n"
        for name, path in (extra_reports or {}).items():
            if Path(path).exists():
                text += f"\n---\n\n" + Path(path).read_text().replace("\n# ", "\n## ", 1) + "\n"

    tmp = out / ".report.md.tmp"
    tmp.write_text(text)
    os.replace(tmp, out / "report.md")
    plot_rows(rows, sets, out, k)
    if wandb_mode != "disabled":
        _log_wandb(title, rows, metrics, out, wandb_mode, wandb_project)
    return metrics


def _log_wandb(title: str, rows: list[dict], metrics: dict, out: Path, mode: str, project: str) -> None:
    import wandb

    run = wandb.init(project=project, name=f"{title}-compare-filters", mode=mode, dir=str(out), reinit=True)
    try:
        keys = [k for k in rows[0] if k != "filter"] if rows else []
        table = wandb.Table(columns=["filter", *keys], data=[[r["filter"], *[r[k] for k in keys]] for r in rows])
        run.log({"compare_filters": table, **metrics})
        for png in sorted(out.glob("*.png")):
            run.log({png.stem: wandb.Image(str(png))})
    finally:
        run.finish()
