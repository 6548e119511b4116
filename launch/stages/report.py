"""The report stage: the compare-filters report of everything the run measured."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from halsift.launch.stages.base import Paths, Stage
from halsift.launch.stages.select import report_rows
from halsift.launch.stages.score import scored_names, scores_dir
from halsift.launch.stages.select import filter_names
from halsift.launch.stages.shared import bench_subset, retrieval_sets

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe


def stage_report(r: Recipe, p: Paths) -> dict:
    """The compare-filters report (markdown, metrics, plots, index.html) from what the run wrote."""
    from halsift.eval.report.compare import compare_filters_report
    from halsift.eval.metrics.retrieval import read_ranks
    from halsift.eval.runs.bench_eval import read_bench_metrics

    rfile = p.stage("eval") / "retrieval.json"
    retrieval = json.loads(rfile.read_text()) if rfile.exists() else {}
    ranks_file = p.stage("eval") / "retrieval_ranks.npz"  # absent in runs from before it was written: no CIs
    ranks = read_ranks(ranks_file) if ranks_file.exists() else None
    bench_file = p.stage("eval") / "bench" / "metrics.json"
    bench = read_bench_metrics(bench_file) if bench_file.exists() else {}  # an earlier halsift's: shares
    beyond_file, hits_file = p.stage("eval") / "beyond.json", p.stage("eval") / "beyond_hits.npz"
    beyond = json.loads(beyond_file.read_text()) if beyond_file.exists() else {}
    beyond_hits = read_ranks(hits_file) if hits_file.exists() else None
    selections = {}
    for name in filter_names(r):
        mpath = p.named("select", name) / "manifest.json"
        selections[name] = json.loads(mpath.read_text()) if mpath.exists() else {}
    metrics = compare_filters_report(r.name, retrieval, bench, selections, list(retrieval_sets(r, p)),
                                     p.stage("report"), wandb_mode=r.wandb.mode, wandb_project=r.wandb.project,
                                     filters=[n for n in scored_names(r) if p.named("score", n).exists()],
                                     extra_reports={n: p.stage("eval") / n / "report.md" for n in r.evals.enabled()},
                                     bench_split=r.eval.bench_split, ranks=ranks, seed=r.seed,
                                     samples=report_samples(r, p), guaranteed=report_rows(r, p, scored_names(r)),
                                     beyond=beyond, beyond_hits=beyond_hits, curation=_curation(p),
                                     judge=judge_spent(r, p))
    return {"metrics": metrics}


def judge_spent(r: Recipe, p: Paths) -> dict[str, dict]:
    """Per filter (selection variants: their scored name's), the judge calls and fraction its corpus scores spent
    (:func:`halsift.filtering.scoring.judge_spend.judge_spend`); ``unfiltered`` spent none."""
    from halsift.filtering.scoring.judge_spend import judge_spend

    spent = {name: judge_spend(scores_dir(p, r.select.resolved(name)[0], "corpus")) for name in filter_names(r)}
    spent = {name: s for name, s in spent.items() if s is not None}
    return spent | ({"unfiltered": {"judge_calls": 0, "judge_fraction": 0.0}} if r.finetune.unfiltered else {})


def _curation(p: Paths) -> dict | None:
    """The dedup stage's manifest when it ran for this corpus (its counts go into the report)."""
    path = p.stage("dedup") / "manifest.json"
    return json.loads(path.read_text()) if p.corpus != p.source_corpus and path.exists() else None


def report_samples(r: Recipe, p: Paths):
    """The report's sample browser: corpus and bench captions with every detector's sentence scores and what each
    filter's selection kept (:func:`halsift.eval.report.html.collect_samples`)."""
    from halsift.eval.report.html import collect_samples

    scored = [n for n in scored_names(r) if p.named("score", n).exists()]
    corpus = {n: scores_dir(p, n, "corpus") for n in scored if scores_dir(p, n, "corpus").exists()}
    bench = {n: scores_dir(p, n, "bench") for n in scored if scores_dir(p, n, "bench").exists()}
    sels = {n: (p.named("select", n), r.select.resolved(n)[0]) for n in filter_names(r)
            if (p.named("select", n) / "kept.parquet").exists()}
    return collect_samples(scored, corpus=p.corpus if corpus else None, corpus_scores=corpus, selections=sels,
                           bench=bench_subset(p.bench, r.eval.bench_split, p.run) if bench else None,
                           bench_scores=bench, keep=r.eval.keep)


STAGE = Stage("report", ("name",), stage_report, clears=True)  # made again from everything before it
