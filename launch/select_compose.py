"""``halsift select``'s composed selection at the command line: ``--scores`` repeated as ``NAME=DIR``, the
:class:`~halsift.filtering.selection.compose.Composition` of its settings, and the summary lines of what each
clause removed."""

from __future__ import annotations

from typing import Any


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
