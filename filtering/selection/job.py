"""``halsift select`` as a library call first: :class:`SelectJob` (the command's settings,
:class:`~halsift.filtering.selection.config.SelectConfig`) behind :func:`halsift.execution.engines.run_job`, the same
door for the command and a recipe's select stage. The job chooses the selection's engine from the flags (in memory,
or out of core and resumable: :func:`engine_of`, refused in one line where it cannot honour a flag, :func:`refusal`),
plans a guaranteed threshold (``max_hallucination``), builds a composed selection (``NAME=DIR`` scores,
``where``/``rank``/``fields``: :func:`composition_of`) and records the guarantee. A resumable select split into
tasks (``--num-tasks``, a SLURM array) returns the manifest only from the task that completes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from halsift.execution.engines import Summary
from halsift.execution.job import Pipeline

if TYPE_CHECKING:
    from halsift.execution.engines import Engine
    from halsift.filtering.selection.config import SelectConfig

MAXCOUNT = 1000  # the in-memory select's samples per output shard when --maxcount is not given


def _pct(v) -> str:
    return f"{v:.1f}%" if isinstance(v, (int, float)) else "n/a"


def summary_line(m: dict) -> str:
    """One line on a select manifest: units kept, precision in -> kept (0–100, and of the sentences, for whole
    captions), keys found on one side only, skipped samples by kind."""
    from halsift.filtering.selection.manifest_scale import on_percent_scale

    m = on_percent_scale(m)
    k, prec, sent = m["keys"], m["precision"], m.get("sentence_precision") or {}
    sentences = (f" (sentences {_pct(sent.get('input'))} -> {_pct(sent.get('kept'))})"
                 if sent and (sent.get("input"), sent.get("kept")) != (prec["input"], prec["kept"]) else "")
    skipped = m.get("skipped", {})
    kinds = ", ".join(f"{kind}={n}" for kind, n in skipped.get("by_kind", {}).items())
    return (f"kept {m['kept_units']} of {m['candidates']} units ({m['samples_written']} samples written); "
            f"precision {_pct(prec['input'])} -> {_pct(prec['kept'])}{sentences}; "
            f"keys only in shards {k['only_in_shards']}, only in scores {k['only_in_scores']}"
            + (f"; {skipped.get('total')} sample(s) skipped" if "total" in skipped else "")
            + (f" ({kinds})" if kinds else ""))


def engine_of(cfg: Any, task: tuple[int, int] | None) -> str:
    """``resumable`` when a flag of ``cfg`` (``halsift select``'s settings) or a SLURM array task's environment
    asks for it, else ``memory``."""
    return "resumable" if cfg.resumable or cfg.keys_only or task is not None or cfg.memory_limit else "memory"


def refusal(cfg: Any, engine: str) -> str | None:
    """Why ``engine`` cannot honour ``cfg`` (one line), or ``None``."""
    from halsift.filtering.selection.out_of_core import supported

    if engine == "memory":
        return None
    flag = "--keys-only" if cfg.keys_only else "--num-tasks" if cfg.num_tasks else "--resumable"
    if cfg.per_captioner or cfg.random:
        return (f"--resumable: not with {'--per-captioner' if cfg.per_captioner else '--random'}; "
                "run select without --resumable/--keys-only/--num-tasks")
    why = supported(cfg.unit, cfg.agg)
    if why:
        return f"--resumable: not for {why}; run select without it"
    if cfg.maxcount is not None:
        return (f"--maxcount: {flag} writes one output shard per input shard; drop --maxcount, or "
                "--resumable/--keys-only/--num-tasks")
    return None


def composition_of(cfg: Any, named: list[tuple[str | None, str]] | None):
    """The composition ``cfg`` (``halsift select``'s settings, or a recipe's) asks for, or ``None`` for a plain
    selection from one unnamed folder."""
    from halsift.filtering.selection.compose import composition, split_scores

    named = named or split_scores(cfg.scores)
    plain = len(named) == 1 and named[0][0] is None
    if plain and not (cfg.where or cfg.rank or cfg.fields or cfg.exclude):
        return None
    return composition(named, fields=cfg.fields, exclude=cfg.exclude, where=cfg.where, rank=cfg.rank,
                       detector=cfg.detector, allow_partial=cfg.allow_partial)


def composition_lines(acc: dict) -> list[str]:
    """What each clause removed (alone, and only it), overlaps, and what the expression kept."""
    n = acc["units"]
    lines = [f"composed: {acc['passed']} of {n} units pass"
             + (f" where {acc['where']}" if acc.get("where") else "")
             + (f"; {acc['candidates']} candidates ranked by {acc.get('rank') or 'the first --scores'}")]
    for c in acc["clauses"]:
        lines.append(f"  {c['clause']}: removes {c['removed']} ({c['removed_only']} by it alone)")
    for o in acc["overlaps"]:
        if o["removed"]:
            lines.append(f"  {o['clauses'][0]} & {o['clauses'][1]}: {o['removed']} removed by both")
    return lines


def basic_names() -> set[str]:
    """The columns ``halsift basic`` writes (its fields and every preset's pass flag)."""
    from halsift.filtering.curation.basic import FIELDS, PRESETS, pass_column

    return (set(FIELDS) - {"key"}) | {pass_column(p) for p in PRESETS}


def recipe_composition(select_cfg: Any, primary: str, scored: dict[str, str], corpus: str, basic_dir: str,
                       show_progress: bool = True):
    """The composition of one recipe selection (``None`` without ``select.where/rank/fields/exclude``): the
    selection's filter first, then every other scored name; when the expressions name a ``halsift basic`` column
    and ``select.fields`` gives none, the basic fields of the corpus are computed once into ``basic_dir``."""
    from halsift.filtering.selection.compose import composition
    from halsift.filtering.selection.expression import parse

    c = select_cfg
    if not (c.where or c.rank or c.fields or c.exclude):
        return None
    used = set()
    for flag, text in (("select.where", c.where), ("select.rank", c.rank)):
        if text:
            used |= set(parse(text, flag).names)
    fields = list(c.fields)
    if used & basic_names() and not fields:
        from halsift.filtering.curation.basic import PRESETS
        from halsift.filtering.curation.basic_run import run_basic
        from halsift.filtering.curation.language import make_detector

        run_basic(corpus, basic_dir, presets=list(PRESETS), detector=make_detector(), show_progress=show_progress)
        fields = [basic_dir]
    named = [(primary, scored[primary])] + [(n, d) for n, d in scored.items() if n != primary and n.isidentifier()]
    return composition(named, fields=fields, exclude=c.exclude, where=c.where, rank=c.rank, prefix="select.")


@dataclass(frozen=True)
class SelectJob(Pipeline):
    """One selection: ``config`` (``halsift select``'s settings). ``compose``: a composed selection built by the
    caller (a recipe's, :func:`recipe_composition`), else the one the config asks for (:func:`composition_of`)."""

    config: "SelectConfig"
    compose: Any = None
    composed: bool = field(default=False)  # compose given (None then means: a plain selection)

    kind = "select"

    def run_on(self, engine: "Engine") -> Summary:
        from halsift.execution.claims import task_from_env
        from halsift.filtering.selection.compose import split_scores
        from halsift.filtering.selection.out_of_core import MEMORY_LIMIT
        from halsift.filtering.selection.resumable import select_resumable
        from halsift.filtering.selection.score_folder import SelectError
        from halsift.filtering.selection.config import amount
        from halsift.filtering.selection.select import select

        cfg = self.config
        task = task_from_env(cfg.num_tasks, cfg.task_index)
        how = engine_of(cfg, task)
        why = refusal(cfg, how)
        if why:
            raise SelectError(why)
        guarantee = plan_guarantee(cfg)
        how_much = amount(cfg.keep, cfg.top_k, guarantee[0].threshold if guarantee else cfg.threshold)
        named = split_scores(cfg.scores)  # [(NAME or None, DIR)], the first is ranked by default
        common = dict(**how_much, unit=cfg.unit, agg=cfg.agg, seed=cfg.seed, show_progress=not cfg.no_progress,
                      meta_defaults={"captioner": cfg.captioner, "source": cfg.source}, detector=cfg.detector,
                      allow_partial=cfg.allow_partial,
                      compose=self.compose if self.composed else composition_of(cfg, named))
        n, i = task or (1, 0)
        lines, run = [], {}
        if how == "memory":
            m = select(named[0][1], cfg.data, cfg.out, per_captioner=cfg.per_captioner, random_baseline=cfg.random,
                       maxcount=cfg.maxcount or MAXCOUNT, **common)
        else:
            run = select_resumable(named[0][1], cfg.data, cfg.out, keys_only=cfg.keys_only, num_tasks=n,
                                   task_index=i, memory_limit=cfg.memory_limit or MEMORY_LIMIT, **common)
            m = run.pop("manifest", None)
        if m is not None and guarantee:
            from halsift.filtering.selection.guaranteed import guarantee_line, record_guarantee

            m = record_guarantee(cfg.out, m, *guarantee)
            lines.append(guarantee_line(m))
        if m is None:
            lines.append(f"select task {i}/{n}: wrote {run['shards_written']} shards; {run['shards_missing']} not "
                         f"written yet (other tasks hold them); the last task to finish writes {cfg.out}/manifest.json")
        elif cfg.keys_only:
            lines.append(f"kept {m['kept_units']} of {m['candidates']} units (threshold {m['threshold_used']}) -> "
                         f"{cfg.out}/kept.parquet")
        else:
            lines.append(f"{summary_line(m)} -> {cfg.out}")
        if m is not None and m.get("composition"):
            lines += composition_lines(m["composition"])
        return Summary(engine.name, Path(cfg.out), m is not None, True, lines, m or run, run)


def plan_guarantee(cfg: "SelectConfig") -> tuple | None:
    """``(Guarantee, Calibration)`` when ``max_hallucination`` is set (the certified threshold), else None."""
    if cfg.max_hallucination is None:
        return None
    from halsift.filtering.selection.guaranteed import plan_guarantee as plan

    return plan(cfg.primary_scores, cfg.calibration, cfg.max_hallucination, cfg.confidence, cfg.unit, cfg.agg,
                cfg.detector, cfg.calibration_captioners, cfg.calibration_splits)


__all__ = ["MAXCOUNT", "SelectJob", "basic_names", "composition_lines", "composition_of", "engine_of",
           "plan_guarantee", "recipe_composition", "refusal", "summary_line"]
