"""The tables of a composed selection's page (``halsift select --html`` with ``--where`` / ``--exclude``): what each
clause removed, alone and by itself only, the pairs of clauses, and what the whole expression kept."""

from __future__ import annotations

from collections.abc import Mapping


def _pct(n: int, total: int) -> str:
    return f"{100 * n / total:.1f}%" if total else "n/a"


def composition_tables(acc: Mapping | None) -> list[dict]:
    """``render_html``'s plain tables for a manifest's ``composition`` (none when it has none)."""
    if not acc:
        return []
    n = acc["units"]
    rows = [[c["clause"], c["removed"], _pct(c["removed"], n), c["removed_only"]] for c in acc["clauses"]]
    rows.append([f"whole expression keeps{' (where ' + acc['where'] + ')' if acc.get('where') else ''}",
                 acc["passed"], _pct(acc["passed"], n), ""])
    out = [{"title": f"What each clause removed (of {n} units)",
            "header": ["clause", "removed", "% of units", "removed by it alone"], "rows": rows}]
    if acc["overlaps"]:
        out.append({"title": "Removed by two clauses",
                    "header": ["clause", "and clause", "removed by both"],
                    "rows": [[o["clauses"][0], o["clauses"][1], o["removed"]] for o in acc["overlaps"]]})
    return out
