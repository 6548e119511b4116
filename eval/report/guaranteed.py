"""The compare report's guaranteed-selection row: per filter, how much of the corpus a selection keeps while its
hallucination rate is certified <= A (Learn-then-Test on the bench's train+val rows; docs/guarantee.md). A better
detector buys more data at the same guarantee: a third way to compare filters, beside AUROC and R@K."""

from __future__ import annotations

from collections.abc import Mapping


INFO = ("error", "units", "best_bound")  # a row's keys that are not levels


def guaranteed_metrics(rows: Mapping[str, Mapping]) -> dict[str, float]:
    """``FILTER/guaranteed_kept@A`` (A and the value in percent) for each certified level."""
    return {f"{f}/guaranteed_kept@{a}": v for f, row in rows.items() for a, v in row.items()
            if a not in INFO and v is not None}


def guaranteed_section(rows: Mapping[str, Mapping]) -> str:
    """The markdown section: one row per filter, one column per A; '-' where no threshold certifies A."""
    levels = sorted({a for row in rows.values() for a in row if a not in INFO}, key=float)
    if not levels:
        return "\n## Guaranteed selection\n\n" + "".join(f"- {f}: {row.get('error', '')}\n" for f, row in rows.items())
    head = ("| filter | " + " | ".join(f"kept % at A = {a} %" for a in levels)
            + " | best bound % | calibration units |\n")
    sep = "|---|" + "---:|" * (len(levels) + 2) + "\n"
    body = "".join(f"| {f} | " + " | ".join("-" if row.get(a) is None else f"{row[a]:.1f}" for a in levels)
                   + f" | {_num(row.get('best_bound'), '.1f')} | {_num(row.get('units'), 'd')} |\n"
                   for f, row in rows.items())
    return ("\n## Guaranteed selection\n\nShare of the corpus kept (%) when the kept units' hallucination rate must "
            "be at most A with the recipe's select.confidence, certified on the bench's train+val rows of the "
            "corpus's captioners (Learn-then-Test; '-': not certifiable with these labels). Best bound: the lowest "
            "upper bound on the hallucination rate any threshold reaches on these labels (a '-' row cannot go below "
            "it).\n\n"
            + head + sep + body)


def _num(v, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)
