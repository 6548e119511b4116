"""Render the detection benchmark report: ``report.md`` (tables laid out like AlignBench Tables 3, 5 and 6) and
PNG plots (AUROC per generator, position curves, per-type bars, self-preference heatmap, score histograms,
precision of the kept share)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from halsift.corpus.atomic import atomic_file, write_text_atomic
from halsift.eval.metrics.detection import PARSE_FAILURE_LIMIT
from halsift.eval.report.markdown import NA, fmt
from halsift.eval.report.markdown import md_table as _table

PLOT_TITLES = {  # plots/<name> -> its caption (report.md headings, index.html captions and alt text)
    "auroc_per_generator.png": "AUROC per generator (95% bootstrap CI)",
    "position.png": "Mean score by sentence position (Fig. 7) and incorrect rate by position",
    "types.png": "Mean score per hallucination type (Fig. 9)",
    "score_hist.png": "Score histograms, correct vs incorrect",
    "precision.png": "Precision of the top kept share vs base rate (HalDec Fig. 8)",
    "self_preference.png": "Self-preference: AUROC / detector mean (diagonal boxed; Fig. 8)",
    "likelihood.png": "Sentence log-likelihood by position, own vs random image (HalDec Fig. 7)",
}


def _fmt(v: float | None, digits: int = 1) -> str:
    return fmt(v, digits)


def generator_order(bench: pd.DataFrame) -> list[tuple[str, str]]:
    """(generator, generator_type) for every generator of the bench: image-to-caption first, then text-to-image."""
    g = bench[["generator_type", "generator"]].drop_duplicates().sort_values(["generator_type", "generator"])
    return [(r.generator, r.generator_type) for r in g.itertuples()]


def auroc_table(bench: pd.DataFrame, results: Sequence) -> str:
    """Table 3 layout: one row per detector, one column per generator (i2t then t2i), then the averages."""
    gens = generator_order(bench)
    header = ["Detector"] + [f"{g} ({t})" for g, t in gens] + ["i2t avg", "t2i avg", "Avg.", "Fail. %"]
    rows = []
    for res in results:
        by_gen = dict(zip(res.generators["generator"], res.generators["auroc"]))
        cells = [res.name]
        for g, _ in gens:
            v = by_gen.get(g, float("nan"))
            ci = res.cis.get(f"auroc/{g}")
            cells.append(f"{_fmt(v)} ({_fmt(ci[0])}–{_fmt(ci[1])})" if ci and math.isfinite(v) else _fmt(v))
        for key in ("auroc/i2t", "auroc/t2i", "auroc/mean"):
            v, ci = res.aurocs.get(key), res.cis.get(key)
            cells.append(f"{_fmt(v)} ({_fmt(ci[0])}–{_fmt(ci[1])})" if ci and v is not None else _fmt(v))
        flag = " ⚠" if res.failure_rate > PARSE_FAILURE_LIMIT else ""
        cells.append(_fmt(res.failure_rate) + flag)
        rows.append(cells)
    return _table(header, rows)


def localization_md(bench: pd.DataFrame, results: Sequence) -> str | None:
    """Table 5 layout: AP / mIoU (%) per generator and the mean over generators."""
    have = [r for r in results if r.localization is not None]
    if not have:
        return None
    gens = generator_order(bench)
    header = ["Detector"] + [f"{g} ({t})" for g, t in gens] + ["Avg."]
    rows = []
    for res in have:
        loc = res.localization.set_index("generator")
        cells = [res.name]
        for g, _ in gens:
            cells.append(f"{_fmt(loc.at[g, 'ap'])} / {_fmt(loc.at[g, 'miou'])}" if g in loc.index else NA)
        cells.append(f"{_fmt(loc['ap'].mean())} / {_fmt(loc['miou'].mean())}")
        rows.append(cells)
    return _table(header, rows)


def ensemble_md(bench: pd.DataFrame, results: Sequence) -> str | None:
    """Table 6 layout: ensemble AUROC per generator with the gain over the better member in parentheses."""
    ens = [r for r in results if r.members]
    if not ens:
        return None
    by_name = {r.name: r for r in results}
    gens = generator_order(bench)
    width = max(len(r.members) for r in ens)
    header = [f"Detector {i + 1}" for i in range(width)] + [f"{g} ({t})" for g, t in gens] + ["Avg."]
    rows = []
    for res in ens:
        cells = res.members + [""] * (width - len(res.members))
        for key in [f"auroc/{g}" for g, _ in gens] + ["auroc/mean"]:
            v = res.aurocs.get(key)
            member_vals = [by_name[m].aurocs.get(key) for m in res.members]
            if v is None or any(m is None for m in member_vals):
                cells.append(_fmt(v))
            else:
                cells.append(f"{_fmt(v)} ({v - max(member_vals):+.1f})")
        rows.append(cells)
    return _table(header, rows)


def _bar_width(results: Sequence) -> float:
    return 0.8 / max(1, len(results))


def _auroc_plot(plt, gens: list[str], results: Sequence):
    x = np.arange(len(gens))
    width = _bar_width(results)
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(gens) + 2), 4))
    for i, res in enumerate(results):
        vals = np.array([res.aurocs.get(f"auroc/{g}", np.nan) for g in gens])
        lo = np.array([res.cis.get(f"auroc/{g}", (np.nan, np.nan))[0] for g in gens])
        hi = np.array([res.cis.get(f"auroc/{g}", (np.nan, np.nan))[1] for g in gens])
        err = np.nan_to_num(np.vstack([vals - lo, hi - vals]), nan=0.0)
        xs = x + i * width - 0.4 + width / 2
        ax.bar(xs, np.nan_to_num(vals), width, yerr=err, capsize=2, label=res.name)
        for xi in xs[np.isnan(vals)]:
            ax.text(xi, 2, "n/a", ha="center", va="bottom", fontsize=7, rotation=90)
    ax.axhline(50, color="gray", lw=0.8, ls="--")
    ax.set_xticks(x, gens, rotation=30, ha="right")
    ax.set_ylabel("AUROC (0–100)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=7)
    return fig


def _position_plot(plt, results: Sequence):
    from matplotlib.ticker import MaxNLocator

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for res in results:
        pos = res.positions
        l, = axes[0].plot(pos["position"] + 1, pos["mean_correct"], marker="o", label=f"{res.name} correct")
        axes[0].plot(pos["position"] + 1, pos["mean_incorrect"], marker="x", ls="--", color=l.get_color(),
                     label=f"{res.name} incorrect")
    for ax in axes:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_xlabel("sentence position")
    axes[0].set_ylabel("mean score")
    axes[0].legend(fontsize=7)
    bpos = results[0].positions
    axes[1].bar(bpos["position"] + 1, bpos["incorrect_rate"])
    axes[1].set_xlabel("sentence position")
    axes[1].set_ylabel("incorrect sentences (%)")
    return fig


def _types_plot(plt, results: Sequence):
    width = _bar_width(results)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    types = list(results[0].types["type"])
    tx = np.arange(len(types))
    for i, res in enumerate(results):
        ax.bar(tx + i * width - 0.4 + width / 2, np.nan_to_num(res.types["mean_score"].to_numpy(dtype=float)),
               width, label=res.name)
    ax.set_xticks(tx, types, rotation=30, ha="right")
    ax.set_ylabel("mean score of incorrect sentences (lower is better)")
    ax.legend(fontsize=7)
    return fig


def _hist_plot(plt, results: Sequence):
    n = len(results)
    fig, axes = plt.subplots(1, n, figsize=(3.5 * n, 3), squeeze=False)
    bins = np.linspace(0, 100, 21)
    for ax, res in zip(axes[0], results):
        s = res.scored
        ax.hist(s.loc[s["label"] == "correct", "score"], bins=bins, alpha=0.6, density=True, label="correct")
        ax.hist(s.loc[s["label"] == "incorrect", "score"], bins=bins, alpha=0.6, density=True, label="incorrect")
        ax.set_title(res.name, fontsize=8)
        ax.set_xlabel("score")
        ax.legend(fontsize=7)
    return fig


def _precision_plot(plt, gens: list[str], results: Sequence, keep: float):
    x = np.arange(len(gens))
    width = _bar_width(results)
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(gens) + 2), 3.8))
    prec0 = results[0].precision.set_index("generator")
    ax.bar(x - 0.4 + width / 2, [prec0["base_rate"].get(g, np.nan) for g in gens], width * 0.9,
           color="lightgray", label="base rate")
    for res in results:
        pr = res.precision.set_index("generator")
        ax.plot(x, [pr["precision"].get(g, np.nan) for g in gens], marker="o", ls="", label=res.name)
    ax.set_xticks(x, gens, rotation=30, ha="right")
    ax.set_ylabel(f"precision of top {100 * keep:g}% (%)")
    ax.legend(fontsize=7)
    return fig


def _self_preference_plot(plt, self_pref: pd.DataFrame, self_pref_map: Mapping[str, str] | None):
    fig, ax = plt.subplots(figsize=(1.2 * self_pref.shape[1] + 2, 0.8 * self_pref.shape[0] + 1.5))
    vals = self_pref.to_numpy(dtype=float)
    span = max(0.05, float(np.nanmax(np.abs(vals - 1.0))))
    im = ax.imshow(vals, cmap="RdBu", vmin=1 - span, vmax=1 + span)  # white = the detector's mean
    ax.set_xticks(range(self_pref.shape[1]), self_pref.columns, rotation=30, ha="right")
    ax.set_yticks(range(self_pref.shape[0]), self_pref.index)
    for i, d in enumerate(self_pref.index):
        for j, g in enumerate(self_pref.columns):
            diag = self_pref_map and self_pref_map.get(d) == g
            dark = abs(self_pref.iat[i, j] - 1.0) > 0.6 * span
            ax.text(j, i, _fmt(self_pref.iat[i, j], 2), ha="center", va="center", fontsize=8,
                    fontweight="bold" if diag else "normal", color="white" if dark else "black")
            if diag:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=2, ec="black"))
    ax.set_xlabel("captioner")
    ax.set_ylabel("detector")
    fig.colorbar(im, ax=ax)
    return fig


def _likelihood_plot(plt, likelihood: pd.DataFrame):
    from halsift.eval.metrics.likelihood import plot_likelihood

    fig, ax = plt.subplots(figsize=(7, 4))
    plot_likelihood(likelihood)(fig, ax)
    return fig


def _plots(out: Path, bench: pd.DataFrame, results: Sequence, self_pref: pd.DataFrame | None,
           self_pref_map: Mapping[str, str] | None, keep: float,
           likelihood: pd.DataFrame | None = None) -> list[tuple[str, str]]:
    """Every bench plot into ``out`` (one function per figure above); returns (title, relative path) pairs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    made: list[tuple[str, str]] = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        with atomic_file(out / name, ".png") as tmp:
            fig.savefig(tmp, dpi=100)
        plt.close(fig)
        made.append((PLOT_TITLES[name], f"plots/{name}"))

    gens = [g for g, _ in generator_order(bench)]
    save(_auroc_plot(plt, gens, results), "auroc_per_generator.png")
    save(_position_plot(plt, results), "position.png")
    save(_types_plot(plt, results), "types.png")
    save(_hist_plot(plt, results), "score_hist.png")
    save(_precision_plot(plt, gens, results, keep), "precision.png")
    if self_pref is not None:
        save(_self_preference_plot(plt, self_pref, self_pref_map), "self_preference.png")
    if likelihood is not None:
        save(_likelihood_plot(plt, likelihood), "likelihood.png")
    return made


def write_report(out_dir: str | os.PathLike, bench: pd.DataFrame, results: Sequence, metrics: Mapping[str, float],
                 keep: float = 0.2, self_pref: pd.DataFrame | None = None,
                 self_pref_map: Mapping[str, str] | None = None, plots: bool = True,
                 likelihood: pd.DataFrame | None = None) -> Path:
    """Write ``report.md`` (and ``plots/*.png``) for a list of :class:`bench_eval.DetectorResult`; ``likelihood``
    (a :func:`halsift.eval.metrics.likelihood.likelihood_table`) adds the Fig. 7 likelihood section."""
    out = Path(out_dir)
    gens = generator_order(bench)
    n_lab = int(bench["label"].isin(("correct", "incorrect")).sum())
    md = ["# Detection benchmark report", "",
          f"Bench: {len(bench)} sentences ({n_lab} labelled, {len(bench) - n_lab} unknown and excluded), "
          f"{bench['image_id'].nunique()} images, {len(gens)} generators. AUROC on a 0–100 scale, positive class "
          "= correct; 95% CIs by bootstrap over images.", "",
          "## AUROC per generator (Table 3)", "", auroc_table(bench, results), ""]
    md += ["## Parse failures", "", _table(["Detector", "scored", "missing", "failure rate %",
                                            f"> {PARSE_FAILURE_LIMIT:g}%"],
                                           [[r.name, len(r.scored), r.n_missing, _fmt(r.failure_rate, 2),
                                             "yes" if r.failure_rate > PARSE_FAILURE_LIMIT else "no"]
                                            for r in results]), ""]
    loc = localization_md(bench, results)
    if loc:
        md += ["## Hallucinated segment localization, AP / mIoU % (Table 5)", "", loc, ""]
    ens = ensemble_md(bench, results)
    if ens:
        md += ["## Ensembles (Table 6): AUROC (gain over the better member)", "", ens, ""]
    rows = []
    for g, t in gens:
        cells = [g, t]
        for res in results:
            pr = res.precision.set_index("generator")
            cells.append(f"{_fmt(pr.at[g, 'precision'])} (base {_fmt(pr.at[g, 'base_rate'])})"
                         if g in pr.index else NA)
        rows.append(cells)
    md += [f"## Precision of the top {100 * keep:g}% kept sentences (HalDec Fig. 8)", "",
           _table(["Generator", "type"] + [r.name for r in results], rows), ""]
    types = list(results[0].types["type"])
    md += ["## Mean score of incorrect sentences per hallucination type (Fig. 9, lower is better)", "",
           _table(["Detector"] + types, [[r.name] + [_fmt(v) for v in r.types["mean_score"]] for r in results]), ""]
    max_pos = max(int(r.positions["position"].max()) for r in results if len(r.positions)) if any(
        len(r.positions) for r in results) else -1
    pos_rows = []
    for res in results:
        p = res.positions.set_index("position")
        for lab in ("correct", "incorrect"):
            pos_rows.append([res.name, lab] + [_fmt(p.at[i, f"mean_{lab}"]) if i in p.index else NA
                                               for i in range(max_pos + 1)])
    bp = results[0].positions.set_index("position")
    pos_rows.append(["(bench)", "incorrect rate %"] + [_fmt(bp.at[i, "incorrect_rate"]) if i in bp.index
                                                       else NA for i in range(max_pos + 1)])
    md += ["## Mean score by sentence position (Fig. 7)", "",
           _table(["Detector", "label"] + [str(i + 1) for i in range(max_pos + 1)], pos_rows), ""]
    if likelihood is not None:

        md += ["## Sentence log-likelihood under the judge's language model (HalDec Fig. 7)", "",
               "Mean log-likelihood (nats/token) of each sentence after its caption's preceding sentences, given its "
               "own image or a random other image of the bench, by position (1 = first sentence). A gap (own − "
               "random) that shrinks with the position means later sentences lean on the language prior.", "",
               likelihood_md(likelihood), ""]
    if self_pref is not None:
        srows = [[d] + [f"**{_fmt(v, 2)}**" if self_pref_map.get(d) == g else _fmt(v, 2) for g, v in row.items()]
                 for d, row in self_pref.iterrows()]
        md += ["## Self-preference (AUROC / detector mean; own captioner in bold)", "",
               _table(["Detector"] + list(self_pref.columns), srows), ""]
    if "agreement/kappa" in metrics:
        md += ["## Inter-annotator agreement", "",
               f"Fleiss' kappa = {metrics['agreement/kappa']:.3f}, observed agreement P̄ = "
               f"{metrics['agreement/p_bar']:.1f}%.", ""]
    notes = [f"- {r.name}: {n}" for r in results for n in r.notes]
    if notes:
        md += ["## Notes (n/a cells and data problems)", ""] + notes + [""]
    if plots:
        made = _plots(out / "plots", bench, results, self_pref, self_pref_map, keep, likelihood)
        md += ["## Plots", ""] + [f"### {t}\n\n![{t}]({p})\n" for t, p in made]
    return write_text_atomic(out / "report.md", "\n".join(md))


def likelihood_md(table: pd.DataFrame) -> str:
    """Markdown table: mean log-likelihood by position (columns, 1 = first sentence) for each label and image."""
    from halsift.eval.metrics.likelihood import LABELS, WHICH

    t = table[table["label"].isin(LABELS)]
    positions = sorted(int(p) for p in t["position"].unique())
    rows = []
    for lab in LABELS:
        sub = t[t["label"] == lab]
        for which in WHICH:
            m = sub.groupby("position")[which].mean()
            rows.append([lab, which] + [_fmt(m.get(p), 3) for p in positions] + [_fmt(sub[which].mean(), 3)
                                                                                  if len(sub) else "n/a"])
        rows.append([lab, "n"] + [str(int((sub["position"] == p).sum())) for p in positions] + [str(len(sub))])
    return _table(["label", "image"] + [str(p + 1) for p in positions] + ["all"], rows)
