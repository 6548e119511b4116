"""``halsift select``'s engines: in memory, or out-of-core keys (DuckDB) with resharding that resumes per shard and
is shared by ``--num-tasks`` processes (or a SLURM array's tasks); which one runs, what each refuses, and the summary
line. Both run the same checks and keep the same output-folder state (:mod:`halsift.filtering.selection.guard`)."""

from __future__ import annotations

from typing import Any

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
