"""The compare-filters report: HalDec Table F (fine-tuned CLIP retrieval R@5 per filter) extended with each
filter's benchmark AUROC and the precision of what it kept, as markdown, metrics.json, plots and a wandb run.

The report opens with the answer: the best real detector by R@k (mean over retrieval sets of the mean of i2t and
t2i R@k, averaged over fine-tuning seeds) and what it bought over ``random`` and ``no-tune``, with a 95% CI from
the per-query ranks of ``eval/retrieval_ranks.npz`` (:mod:`halsift.eval.metrics.filter_delta`): over fine-tuning
seeds and retrieval queries where both models have >= 2 seeds (or none), else over the queries only, said so in the
answer with the seed spread measured on the quickstart's world (:mod:`halsift.eval.report.seed_spread`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from halsift.corpus.atomic import write_text_atomic
from halsift.eval.metrics.filter_delta import delta_interval
from halsift.eval.report.beyond import add_beyond, beyond_keys, beyond_markdown, plot_gain_over_random
from halsift.eval.report.outputs import with_scale_note
from halsift.eval.report.seed_spread import per_seed_text, seed_caveat, seed_dots
from halsift.filtering.selection.manifest_scale import on_percent_scale

NOT_DETECTORS = ("oracle", "random", "no-tune", "unfiltered")  # bounds and baselines: never the "best filter"
REFERENCES = (("random", "delta_random"), ("no-tune", "delta_no_tune"))  # what the best filter is compared with
SEEDLESS = ("no-tune",)  # the un-tuned base model: no fine-tuning seed, no seed variance
BEYOND_COLUMNS = (("zeroshot/acc1", "zero-shot top-1"), ("compositional/mean", "compositional"))


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    arr = np.asarray([v for v in values if v is not None and np.isfinite(v)], dtype=float)
    if arr.size == 0:
        return float("nan"), float("nan")
    return float(arr.mean()), float(arr.std(ddof=1)) if arr.size > 1 else 0.0


def _kept_precision(manifest: Mapping) -> float | None:
    """Percentage (0–100) of correct sentences in what a selection kept (``sentence_precision``, whatever its unit;
    older manifests: ``precision``; manifests of shares read as percentages)."""
    manifest = on_percent_scale(manifest)
    for key in ("sentence_precision", "precision", "kept_precision"):
        v = manifest.get(key)
        if isinstance(v, (int, float)):
            return float(v)
        if isinstance(v, Mapping):
            for sub in ("kept", "all", "overall"):
                if isinstance(v.get(sub), (int, float)):
                    return float(v[sub])
    return None


def _input_precision(manifests: Mapping[str, Mapping]) -> float | None:
    """Percentage (0–100) of correct sentences in the unfiltered corpus, from the first manifest that has it."""
    for m in map(on_percent_scale, manifests.values()):
        for key in ("input_precision",):
            if isinstance(m.get(key), (int, float)):
                return float(m[key])
        for key in ("sentence_precision", "precision"):
            prec = m.get(key)
            if isinstance(prec, Mapping) and isinstance(prec.get("input"), (int, float)):
                return float(prec["input"])
    return None


def compare_table(retrieval: Mapping[str, list[dict]], bench: Mapping[str, float],
                  selections: Mapping[str, Mapping], sets: Sequence[str], k: int = 5,
                  filters: Sequence[str] | None = None, judge: Mapping[str, Mapping] | None = None) -> list[dict]:
    """One row per filter (``no-tune`` first): R@k per set and direction (mean, std over seeds), AUROC, precision,
    and the judge calls and judge fraction (%) its scoring spent (``judge``, per filter; None / NaN where not given)."""
    rows = []
    names = [n for n in ("no-tune", "unfiltered") if n in retrieval] + list(filters or [])
    names += [n for n in retrieval if n not in names]
    for name in names:
        runs = retrieval.get(name, [])
        row: dict = {"filter": name, "seeds": len(runs)}
        row["variant"] = filters is not None and name not in filters and name not in NOT_DETECTORS
        for s in sets:
            for d in ("i2t", "t2i"):
                mean, std = _mean_std([run.get(f"{s}/{d}/r@{k}") for run in runs])
                row[f"{s}/{d}/r@{k}"] = mean
                row[f"{s}/{d}/r@{k}/std"] = std
        row["per_seed"] = [run_recall(run, sets, k) for run in runs]  # R@k of each fine-tuning seed, in order
        row[f"r@{k}"], row[f"r@{k}/std"] = _mean_std(row["per_seed"])
        single = filters is not None and len(filters) == 1 and name == filters[0]
        auroc = bench.get(f"{name}/auroc/mean", bench.get("auroc/mean") if single else None)
        row["auroc/mean"] = float(auroc) if auroc is not None else float("nan")
        man = selections.get(name, {})
        prec = _kept_precision(man)
        row["kept_precision"] = prec if prec is not None else float("nan")
        kept = man.get("kept_units", man.get("kept"))
        row["kept"] = int(kept) if isinstance(kept, (int, float)) else None
        spent = (judge or {}).get(name) or {}
        calls, frac = spent.get("judge_calls"), spent.get("judge_fraction")
        row["judge_calls"] = int(calls) if isinstance(calls, (int, float)) else None
        row["judge_fraction"] = float(frac) if isinstance(frac, (int, float)) else float("nan")
        rows.append(row)
    return rows


def run_recall(run: Mapping[str, float], sets: Sequence[str], k: int = 5) -> float:
    """One model's R@k: mean over retrieval sets of the mean of its i2t and t2i R@k (NaN if one is missing)."""
    vals = [run.get(f"{s}/{d}/r@{k}") for s in sets for d in ("i2t", "t2i")]
    return float(np.mean(vals)) if vals and all(isinstance(v, (int, float)) for v in vals) else float("nan")


def add_deltas(rows: list[dict], ranks: Mapping[str, np.ndarray] | None, sets: Sequence[str], k: int = 5,
               n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> None:
    """Add to every row, for the references ``random`` and ``no-tune``: ``delta_<ref>/r@k``; ``/ci_low``,
    ``/ci_high`` (the query interval: paired bootstrap over the retrieval queries); ``/seeds_ci_low``,
    ``/seeds_ci_high``, ``/seeds_df`` (the two-level interval over fine-tuning seeds and queries, where both models
    have >= 2 seeds or none: :func:`halsift.eval.metrics.filter_delta.delta_interval`); NaN without ranks; and
    ``/std`` (the two filters' seed stds combined)."""
    by_name, draws = {r["filter"]: r for r in rows}, {}
    for ref, tag in REFERENCES:
        base = by_name.get(ref)
        for row in rows:
            delta = row[f"r@{k}"] - base[f"r@{k}"] if base is not None else float("nan")
            std = float(np.hypot(row[f"r@{k}/std"], base[f"r@{k}/std"])) if base is not None else float("nan")
            std = 0.0 if row is base else std
            iv = None
            if ranks and base is not None and row is not base:
                iv = delta_interval(ranks, (row["filter"], row["seeds"]), (ref, base["seeds"]), sets, k, n_boot,
                                    seed, level, draws, seedless=SEEDLESS)
            nan = float("nan")
            row[f"{tag}/r@{k}"], row[f"{tag}/std"] = delta, std
            row[f"{tag}/ci_low"], row[f"{tag}/ci_high"] = (iv.query_low, iv.query_high) if iv else (nan, nan)
            row[f"{tag}/seeds_ci_low"], row[f"{tag}/seeds_ci_high"], row[f"{tag}/seeds_df"] = (
                (iv.seeds_low, iv.seeds_high, iv.df) if iv else (nan, nan, nan))


def _interval(row: dict, tag: str, k: int) -> tuple[float, float, str]:
    """(low, high, kind): the two-level interval (kind ``seeds``), else the query interval (``queries``), else the
    delta ± its seed std when there were no ranks (``std``)."""
    for kind, lo_key, hi_key in (("seeds", "seeds_ci_low", "seeds_ci_high"), ("queries", "ci_low", "ci_high")):
        lo, hi = row.get(f"{tag}/{lo_key}", np.nan), row.get(f"{tag}/{hi_key}", np.nan)
        if np.isfinite(lo) and np.isfinite(hi):
            return lo, hi, kind
    d, sd = row[f"{tag}/r@{k}"], row[f"{tag}/std"]
    sd = sd if np.isfinite(sd) else 0.0
    return d - sd, d + sd, "std"


def metrics_interval(metrics: Mapping[str, float], name: str, tag: str = "delta_random", k: int = 5
                     ) -> tuple[float, float, str]:
    """The interval the report's answer reads for filter ``name``'s ``tag`` difference, from its ``metrics.json``
    (as :func:`_interval`: over seeds and queries, else the queries, else ± the seeds' std); kind ``none`` (NaN
    bounds) where the report has no such difference."""
    prefix = f"{name}/"
    row = {key[len(prefix):]: v for key, v in metrics.items() if key.startswith(prefix)}
    if f"{tag}/r@{k}" not in row:
        return float("nan"), float("nan"), "none"
    return _interval({f"{tag}/std": float("nan")} | row, tag, k)


INTERVAL_WORDS = {"seeds": "over fine-tuning seeds and queries", "queries": "over the queries only"}


def _versus(row: dict, ref: str, tag: str, k: int) -> tuple[str, str]:
    """Half a sentence on what ``row`` bought over ``ref``, and the kind of interval it used (:func:`_interval`)."""
    d = row[f"{tag}/r@{k}"]
    lo, hi, kind = _interval(row, tag, k)
    spread = (f"95% CI {lo:+.1f} to {hi:+.1f} {INTERVAL_WORDS[kind]}" if kind in INTERVAL_WORDS
              else f"± {(hi - lo) / 2:.1f} std over seeds, no CI")
    if lo > 0:
        return f"over `{ref}` it bought {d:+.1f} R@{k} points ({spread})", kind
    where = "is below 0" if hi < 0 else "includes 0"
    return f"it does not beat `{ref}`: {d:+.1f} R@{k} points ({spread}, which {where})", kind


def best_filter(rows: list[dict], k: int = 5) -> dict | None:
    """The real detector's row with the highest R@k (bounds, baselines and selection variants excluded), or None."""
    cands = [r for r in rows if r["filter"] not in NOT_DETECTORS and not r.get("variant")
             and np.isfinite(r[f"r@{k}"])]
    return max(cands, key=lambda r: r[f"r@{k}"]) if cands else None


def headline(rows: list[dict], sets: Sequence[str], k: int = 5, n_boot: int = 1000) -> str:
    """The report's opening: the best detector filter and what it bought over ``random`` and ``no-tune``."""
    best = best_filter(rows, k)
    if best is None:
        return ("**No detector filter was fine-tuned and evaluated in this run** (only the bounds `oracle`/`random` "
                "and the baselines), so there is no best filter to report.")
    n, n_sets = best["seeds"], len(sets)
    text = (f"**Best detector filter: `{best['filter']}`**, R@{k} {best[f'r@{k}']:.1f} (mean of i2t and t2i "
            f"R@{k} over {n_sets} retrieval set{'s' * (n_sets != 1)}, averaged over {n} fine-tuning "
            f"seed{'s' * (n != 1)}).")
    names = {r["filter"] for r in rows if np.isfinite(r[f"r@{k}"])}
    parts = [(ref, tag, *_versus(best, ref, tag, k)) for ref, tag in REFERENCES if ref in names]
    missing = [f"`{ref}`" for ref, _ in REFERENCES if ref not in names]
    if parts:
        sentence = "; ".join(p[2] for p in parts)
        text += " " + sentence[0].upper() + sentence[1:] + "."
    if missing:
        text += f" No {' or '.join(missing)} model in this run to compare with."
    kinds = {p[3] for p in parts}
    if "queries" in kinds:  # training noise left out: said in the answer, with its measured size
        text += " " + seed_caveat(n, k)
    notes = []
    if "seeds" in kinds:
        alone = "; ".join(f"{best[f'{tag}/ci_low']:+.1f} to {best[f'{tag}/ci_high']:+.1f} over `{ref}`"
                          for ref, tag, _, kind in parts if kind == "seeds")
        notes.append(f"95% CIs over fine-tuning seeds and queries: the seeds' variance of each filter's R@{k} (its "
                     "own seeds, not paired: seed s draws the same random streams over different selections) plus "
                     f"the queries' (paired bootstrap, {n_boot} replicates resampling images with all their "
                     "captions, the same draw for both filters), with a t quantile of Welch-Satterthwaite degrees of "
                     f"freedom (docs/table_f.md); over the queries alone they would be {alone}. The ± in the table "
                     "is the std over fine-tuning seeds.")
    if "queries" in kinds:
        notes.append(f"95% CIs over the queries: paired bootstrap over the retrieval queries ({n_boot} replicates "
                     "resampling images with all their captions, the same draw for both filters, fine-tuning seeds "
                     "averaged inside each replicate); they cover evaluation-set sampling only.")
    if "std" in kinds:
        notes.append("No per-query ranks (`eval/retrieval_ranks.npz`; older runs lack them) for these models, so "
                     "no confidence interval: the ± is the std over fine-tuning seeds of the two filters' "
                     f"R@{k}, combined; it ignores evaluation-set sampling.")
    return text + ("\n\n_" + " ".join(notes) + "_" if notes else "")


def kept_precision_spearman(rows: list[dict], k: int = 5) -> tuple[float, float, int]:
    """Spearman rho (and p) between kept precision and R@k over the filters with both; NaN below 3 filters.

    Selection variants (``select.variants``: other keep fractions or units) are left out: they change how much is
    kept as well as how clean it is, so they would mix quantity into a correlation about precision."""
    import warnings

    from scipy.stats import spearmanr

    pts = [(r["kept_precision"], r[f"r@{k}"]) for r in rows
           if not r.get("variant") and np.isfinite(r["kept_precision"]) and np.isfinite(r[f"r@{k}"])]
    if len(pts) < 3:
        return float("nan"), float("nan"), len(pts)
    with warnings.catch_warnings():  # constant input: NaN, said in the report
        warnings.simplefilter("ignore")
        res = spearmanr(*zip(*pts))
    return float(res.statistic), float(res.pvalue), len(pts)


def _fmt_delta(row: dict, ref: str, tag: str, k: int) -> str:
    d = row.get(f"{tag}/r@{k}", float("nan"))
    if row["filter"] == ref or not np.isfinite(d):
        return "–"
    lo, hi, kind = _interval(row, tag, k)
    return f"{d:+.1f} [{lo:+.1f}, {hi:+.1f}]" if kind != "std" else f"{d:+.1f} ± {(hi - lo) / 2:.1f}"


def _fmt(v, std=None) -> str:
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "–"
    return f"{v:.1f} ± {std:.1f}" if std is not None and np.isfinite(std) and std > 0 else f"{v:.1f}"


def table_cells(rows: list[dict], sets: Sequence[str], k: int = 5) -> tuple[list[str], list[list[str]]]:
    """The compare-filters table as text cells: (header, one list of cells per row), for markdown and HTML."""
    head = ["Filter", *[f"{s} {d} R@{k}" for s in sets for d in ("i2t", "t2i")], f"R@{k}", f"R@{k} per seed",
            "Δ vs random", "bench AUROC", "kept precision", "kept", "seeds"]
    body = []
    for row in rows:
        cells = [row["filter"]]
        for s in sets:
            for d in ("i2t", "t2i"):
                cells.append(_fmt(row[f"{s}/{d}/r@{k}"], row[f"{s}/{d}/r@{k}/std"]))
        cells += [_fmt(row[f"r@{k}"], row[f"r@{k}/std"]), per_seed_text(row.get("per_seed", [])),
                  _fmt_delta(row, *REFERENCES[0], k)]
        cells += [_fmt(row["auroc/mean"]), _fmt(row["kept_precision"]),
                  str(row["kept"]) if row["kept"] is not None else "–", str(row["seeds"])]
        body.append(cells)
    if has_judge_spend(rows):  # beside retrieval and kept precision: what each filter spent on the judge
        at = head.index("kept") + 1
        head[at:at] = ["judge calls", "judge %"]
        for row, cells in zip(rows, body):
            cells[at:at] = [str(row["judge_calls"]) if row.get("judge_calls") is not None else "–",
                            _fmt(row.get("judge_fraction"))]
    extra = [(m, label) for m, label in BEYOND_COLUMNS if any(m in r for r in rows)]  # beyond retrieval, if measured
    if extra:
        at = head.index("Δ vs random") + 1
        head[at:at] = [label for _, label in extra]
        for row, cells in zip(rows, body):
            cells[at:at] = [_fmt(row.get(m), row.get(f"{m}/std")) for m, _ in extra]
    return head, body


def has_judge_spend(rows: list[dict]) -> bool:
    """Whether any row says what its scoring spent on the judge (the judge columns and plot are drawn then)."""
    return any(r.get("judge_calls") is not None for r in rows)


JUDGE_NOTE = ("Judge calls: the units (sentences, or captions when scored per caption) the VLM judge scored for "
              "the filter's corpus scores; judge %: their share of the corpus's units (a cascade's manifest says "
              "what it spent; a detector with a judge judges every unit, 100%; one without, such as CLIP, a LoRA "
              "CLIP, random or oracle, 0%; what counts as a judge: docs/cascade.md).")


def table_caption(k: int = 5, bench_split: str = "") -> str:
    """What the compare-filters table shows, in one paragraph (markdown)."""
    return ("Fine-tuned CLIP retrieval per filter (HalDec Table F), with each filter's sentence-level detection "
            f"AUROC on the benchmark{f' ({bench_split} split)' if bench_split else ''} and the precision "
            "(share of correct sentences) of what it kept. "
            f"AUROC, R@k and precision on a 0–100 scale; R@k mean ± std over fine-tuning seeds. R@{k}: mean over "
            f"retrieval sets of the mean of i2t and t2i R@{k}; R@{k} per seed: each fine-tuning seed's, in seed "
            f"order; Δ vs random: its difference to `random` in R@{k} points, with the 95% CI in brackets: over "
            "fine-tuning seeds and retrieval queries where both have 2 or more seeds, over the queries only with "
            "one (or ± the seeds' std where there are no per-query ranks).")


def spearman_sentence(rows: list[dict], k: int = 5, spearman: tuple[float, float, int] | None = None) -> str:
    """The kept-precision vs R@k correlation in one sentence."""
    rho, pval, n = spearman if spearman is not None else kept_precision_spearman(rows, k)
    p_text = "p < 0.001" if pval < 1e-3 else f"p = {pval:.2g}"
    return (f"Spearman correlation between kept precision and R@{k} across the {n} filters with both: "
            + (f"ρ = {rho:.2f} ({p_text})." if np.isfinite(rho) else
               "not defined (fewer than 3 filters or a constant column)."))


def render_markdown(title: str, rows: list[dict], sets: Sequence[str], input_precision: float | None,
                    k: int = 5, bench_split: str = "", n_boot: int = 1000,
                    spearman: tuple[float, float, int] | None = None) -> str:
    """``report.md``: the headline (:func:`headline`), the table, the kept-precision correlation and the plots."""
    if not rows:
        return f"# Report: {title}\n\nNo filters were compared in this run (no score/select/finetune stages).\n"
    head, body = table_cells(rows, sets, k)
    lines = [f"# Compare filters: {title}", "", headline(rows, sets, k, n_boot), "",
             table_caption(k, bench_split), ""]
    if input_precision is not None:
        lines += [f"Precision of the unfiltered corpus: {input_precision:.1f}%.", ""]
    lines += ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    lines += ["| " + " | ".join(cells) + " |" for cells in body]
    lines += ["", spearman_sentence(rows, k, spearman)]
    if has_judge_spend(rows):
        lines += ["", JUDGE_NOTE]
    lines += ["", "Plots: `r_at_k.png` (R@k per filter), `auroc_vs_recall.png` (detector AUROC vs what its "
              f"filter buys), `dose_response.png` (ΔR@{k} over random vs the kept precision of each filter's "
              "selection, with 95% CIs; no-tune dashed)"
              + (", `gain_over_random.png` (each filter's gain over random per measure)" if beyond_keys(rows) else "")
              + (f", `judge_fraction.png` (ΔR@{k} over random vs the judge fraction of each filter, with 95% CIs)"
                 if has_judge_spend(rows) else "") + ".", ""]
    section = beyond_markdown(rows, beyond_keys(rows), n_boot)
    return "\n".join(lines) + ("\n" + section if section else "")


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


def plot_dose_response(rows: list[dict], out: Path, k: int = 5) -> Path | None:
    """``dose_response.png``: ΔR@k over random vs kept precision (%), one labelled point per filter with its 95% CI
    (or ± seed std) as error bar, and no-tune's Δ as a dashed line. None when there is nothing to draw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tag = REFERENCES[0][1]
    pts = [r for r in rows if np.isfinite(r["kept_precision"]) and np.isfinite(r[f"{tag}/r@{k}"])]
    no_tune = next((r for r in rows if r["filter"] == "no-tune" and np.isfinite(r[f"{tag}/r@{k}"])), None)
    if not pts and no_tune is None:
        return None
    fig, ax = plt.subplots(figsize=(5, 3.8))
    if pts:
        x = np.array([r["kept_precision"] for r in pts])
        y = np.array([r[f"{tag}/r@{k}"] for r in pts])
        spans = [_interval(r, tag, k) for r in pts]
        yerr = np.abs(np.array([sp[:2] for sp in spans]) - y[:, None]).T
        label = ("filter (95% CI)" if all(sp[2] != "std" for sp in spans if sp[1] > sp[0])
                 else "filter (CI or ± seed std)")
        ax.errorbar(x, y, yerr=yerr, fmt="o", capsize=3, label=label)
        for r, xi, yi in zip(pts, x, y):
            ax.annotate(r["filter"], (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.axhline(0.0, color="grey", lw=0.8, ls=":")
    if no_tune is not None:
        ax.axhline(no_tune[f"{tag}/r@{k}"], color="C3", ls="--", label="no-tune")
    ax.set_xlabel("kept precision (%)")
    ax.set_ylabel(f"ΔR@{k} over random (points)")
    ax.set_title("Dose-response: cleaner data vs retrieval gain")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "dose_response.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_judge_fraction(rows: list[dict], out: Path, k: int = 5) -> Path | None:
    """``judge_fraction.png``: ΔR@k over random vs the judge fraction (%), one labelled point per filter with its
    95% CI as error bar (over seeds and queries, else over the queries; none without per-query ranks). None (and no
    stale file) when no filter says what it spent on the judge."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tag = REFERENCES[0][1]
    path = out / "judge_fraction.png"
    pts = [r for r in rows if np.isfinite(r.get("judge_fraction", np.nan)) and np.isfinite(r[f"{tag}/r@{k}"])]
    if not pts:
        path.unlink(missing_ok=True)
        return None
    x = np.array([r["judge_fraction"] for r in pts])
    y = np.array([r[f"{tag}/r@{k}"] for r in pts])
    spans = [_interval(r, tag, k) for r in pts]  # a CI, none where there were no ranks
    lo, hi = (np.array([sp[i] if sp[2] != "std" else np.nan for sp in spans]) for i in (0, 1))
    err = np.where(np.isfinite(lo) & np.isfinite(hi), np.abs(np.stack([y - lo, hi - y])), 0.0)
    fig, ax = plt.subplots(figsize=(5, 3.8))
    ax.errorbar(x, y, yerr=err if err.any() else None, fmt="o", capsize=3)
    for r, xi, yi in zip(pts, x, y):
        ax.annotate(r["filter"], (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.axhline(0.0, color="grey", lw=0.8, ls=":")
    ax.set_xlim(-5, max(115.0, float(x.max()) + 15))  # room for the labels right of the points
    ax.set_xlabel("judge fraction (% of units the judge scored)")
    ax.set_ylabel(f"ΔR@{k} over random (points)")
    ax.set_title("Retrieval gain vs judge spent" + (" (95% CIs)" if err.any() else " (no per-query ranks: no CIs)"))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def compare_filters_report(title: str, retrieval: Mapping[str, list[dict]], bench: Mapping[str, float],
                           selections: Mapping[str, Mapping], sets: Sequence[str], out_dir: str | os.PathLike,
                           wandb_mode: str = "offline", wandb_project: str = "halsift", k: int = 5,
                           filters: Sequence[str] | None = None,
                           extra_reports: Mapping[str, Path] | None = None, bench_split: str = "",
                           ranks: Mapping[str, np.ndarray] | None = None, n_boot: int = 1000, seed: int = 0,
                           samples=None, html: bool = True, guaranteed: Mapping[str, Mapping] | None = None,
                           beyond: Mapping[str, list[dict]] | None = None,
                           beyond_hits: Mapping[str, np.ndarray] | None = None, curation: Mapping | None = None,
                           judge: Mapping[str, Mapping] | None = None) -> dict:
    """Write ``metrics.json``, ``report.md``, plots, ``index.html`` and (unless disabled) an offline wandb run;
    returns metrics.

    ``ranks``: the per-query ranks of ``eval/retrieval_ranks.npz`` (keys of ``halsift.eval.metrics.retrieval.ranks_key``
    and ``<set>/text_to_image``) for the bootstrap CIs; without them the deltas carry the seeds' std instead.
    ``samples``: a :class:`halsift.eval.report.html.SampleSet` for the page's sample browser and the wandb Table.
    ``guaranteed``: per filter, the kept share (0-100) of a guaranteed selection at each A (percent key; None: not
    certified): :mod:`halsift.eval.report.guaranteed`'s section and ``FILTER/guaranteed_kept@A`` metrics.
    ``beyond``: ``eval/beyond.json`` (zero-shot and compositional metrics per model and seed) and ``beyond_hits``
    its per-sample hits (``eval/beyond_hits.npz``), for :mod:`halsift.eval.report.beyond`.
    ``curation``: the dedup stage's manifest (its removed counts are stated under the table).
    ``judge``: per filter, ``{"judge_calls", "judge_fraction"}`` (%) its scores spent
    (:func:`halsift.filtering.scoring.judge_spend.judge_spend`): the judge columns, ``judge_fraction.png`` and
    ``FILTER/judge_calls`` / ``FILTER/judge_fraction`` metrics.
    """
    from halsift.corpus.shards import write_json_atomic

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = compare_table(retrieval, bench, selections, sets, k, filters, judge)
    add_deltas(rows, ranks, sets, k, n_boot, seed)
    add_beyond(rows, beyond or {}, beyond_hits, n_boot, seed)
    metrics = {f"{r['filter']}/{key}": v for r in rows for key, v in r.items()
               if key not in ("filter", "variant") and isinstance(v, (int, float)) and np.isfinite(v)}
    metrics.update({f"{r['filter']}/r@{k}/seed{i}": v for r in rows for i, v in enumerate(r["per_seed"])
                    if np.isfinite(v)})
    spearman = kept_precision_spearman(rows, k)
    if np.isfinite(spearman[0]):
        metrics[f"spearman/kept_precision_vs_r@{k}"] = spearman[0]
        metrics[f"spearman/kept_precision_vs_r@{k}/p"] = spearman[1]
    if guaranteed:
        from halsift.eval.report.guaranteed import guaranteed_metrics, guaranteed_section

        metrics.update(guaranteed_metrics(guaranteed))
    write_json_atomic(out / "metrics.json", metrics)
    text = render_markdown(title, rows, sets, _input_precision(selections), k, bench_split, n_boot, spearman)
    if guaranteed:
        text += guaranteed_section(guaranteed)
    if curation:
        text += "\n" + curation_sentence(curation) + "\n"
    bench_report = Path(out_dir).parent / "eval" / "bench" / "report.md"
    links = ({"detection benchmark": bench_report} if bench_report.exists() else {}) | dict(extra_reports or {})
    if links:
        text += "\n## Other reports\n\n" + "".join(
            f"- {name}: `{os.path.relpath(path, out)}`\n" for name, path in links.items()) + "\n"
        for name, path in (extra_reports or {}).items():
            if Path(path).exists():
                text += "\n---\n\n" + with_scale_note(Path(path).read_text().replace("\n# ", "\n## ", 1),
                                                       Path(path).parent) + "\n"

    write_text_atomic(out / "report.md", text)
    plot_rows(rows, sets, out, k)
    plot_dose_response(rows, out, k)
    plot_gain_over_random(rows, out, k)
    plot_judge_fraction(rows, out, k)
    if html:
        write_html(title, rows, sets, out, k, bench, _input_precision(selections), bench_split, n_boot, spearman,
                   samples, links)
    if wandb_mode != "disabled":
        _log_wandb(title, rows, metrics, out, wandb_mode, wandb_project, samples)
    return metrics


def curation_sentence(m: Mapping) -> str:
    """What decontamination removed from the corpus before scoring, in one sentence (a dedup manifest)."""
    c = m.get("counts", {})
    return (f"Before scoring, {m.get('removed', 0)} of {m.get('samples', 0)} corpus samples were removed: "
            f"{c.get('eval', 0)} leaks of the evaluation images, {c.get('exact', 0)} exact and {c.get('near', 0)} "
            "near duplicates (`dedup/manifest.json`).")


PLOTS = {"r_at_k.png": "Fine-tuned CLIP retrieval R@{k} per filter (mean ± std over seeds)",
         "auroc_vs_recall.png": "Detector AUROC on the bench vs the retrieval R@{k} its filter bought",
         "dose_response.png": "Dose-response: ΔR@{k} over random vs the kept precision of each filter's selection "
                              "(95% CIs; no-tune dashed)",
         "gain_over_random.png": "Gain over random per measure: R@{k}, zero-shot top-1 and mean per-class recall, "
                                 "compositional mean (95% CIs)",
         "judge_fraction.png": "ΔR@{k} over random vs the judge fraction: the share of units the VLM judge scored "
                               "for each filter (95% CIs)"}


def write_html(title: str, rows: list[dict], sets: Sequence[str], out: Path, k: int, bench: Mapping[str, float],
               input_precision: float | None, bench_split: str, n_boot: int, spearman: tuple[float, float, int],
               samples=None, links: Mapping[str, Path] | None = None) -> Path:
    """``index.html``: the answer, the table (rows linked to their filter's samples), these plots and the bench's,
    the bench tables (AUROC per generator with CIs, types, positions) and the sample browser."""
    from halsift.eval.report import html as hr

    head, body = table_cells(rows, sets, k)
    notes = [table_caption(k, bench_split)]
    if input_precision is not None:
        notes.append(f"Precision of the unfiltered corpus: {input_precision:.1f}%.")
    if rows:
        notes.append(spearman_sentence(rows, k, spearman))
    if has_judge_spend(rows):
        notes.append(JUDGE_NOTE)
    dots = seed_dots([r["per_seed"] for r in rows])  # a dot plot per filter: one dot per fine-tuning seed
    table = {"caption": "Fine-tuned CLIP retrieval per filter (HalDec Table F); 'kept' / 'dropped' open that "
                        "filter's samples below", "header": head, "dots_col": head.index(f"R@{k} per seed"),
             "rows": [{"cells": cells, "filter": r["filter"], "dots": d}
                      for cells, r, d in zip(body, rows, dots)]} if rows else None
    figures = [hr.figure(out / name, t.format(k=k)) for name, t in PLOTS.items()]
    bench_dir = out.parent / "eval" / "bench"
    figures += hr.bench_figures(bench_dir / "plots")
    detectors = [r["filter"] for r in rows if not r.get("variant") and r["filter"] not in ("no-tune", "unfiltered")]
    detectors = (samples.detectors if samples is not None and samples.detectors else detectors)
    page_links = {"report.md": "report.md"} | {f"{name} (report.md)": os.path.relpath(path, out) for name, path in
                                                (links or {}).items() if Path(path).exists()}
    return hr.render_html(out, title, headline=headline(rows, sets, k, n_boot) if rows else "", table=table,
                          notes=notes, figures=figures, tables=hr.bench_tables(bench, detectors), samples=samples,
                          links=page_links)


def _log_wandb(title: str, rows: list[dict], metrics: dict, out: Path, mode: str, project: str,
               samples=None) -> None:
    import wandb

    from halsift.eval.report.html import wandb_data_dir

    with wandb_data_dir(out / "wandb" / "data"):
        run = wandb.init(project=project, name=f"{title}-compare-filters", mode=mode, dir=str(out), reinit=True)
        _log_run(run, rows, metrics, out, samples)


def _log_run(run, rows: list[dict], metrics: dict, out: Path, samples=None) -> None:
    import wandb

    try:
        keys = [k for k in rows[0] if k not in ("filter", "variant", "per_seed")] if rows else []
        table = wandb.Table(columns=["filter", *keys], data=[[r["filter"], *[r[k] for k in keys]] for r in rows])
        run.log({"compare_filters": table, **metrics})
        for png in sorted(out.glob("*.png")):
            run.log({png.stem: wandb.Image(str(png))})
        if samples is not None and samples.samples:
            from halsift.eval.report.html import log_samples_table

            log_samples_table(run, samples, out)
    finally:
        run.finish()
