"""What a score folder spent on the judge: judge calls and the judge fraction, for the compare report (issue 44).

The one place that says what counts as a judge. A detector spec is a judge when any node of it
(:func:`~halsift.filtering.detectors.spec.iter_specs`: the spec, its ensemble members, nested specs) is of a
family whose class declares ``CALLS_JUDGE = True`` (a VLM asked about the sentence: today ``vlm``, ``api``, ``vllm``;
read from the class, never a list of names here) or a ``lora`` adapter of kind ``vlm`` (its ``detector.yaml``). A judge spec judges every unit it scores: its calls are the folder's
units and its fraction 100 %. ``clip``, a ``lora`` CLIP adapter, ``random`` and ``oracle`` call no judge (0); a
distilled ``student`` calls none when it scores, but its teacher's calls (the judge's score folder its ``config.json``
names) were spent to make it and are counted with it (:func:`teacher_calls`). A cascade's folder says what it spent
(its manifest's ``cascade`` block). A recipe ensemble (mean of score folders, ``members``) spent what its members
did, summed: an ensemble of two judges spends two calls per unit.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from halsift.corpus.percent import ratio_percent

MANIFEST = "_manifest.json"


def is_judge_spec(spec: str | dict) -> bool | None:
    """Whether a detector spec calls a judge on every unit it scores; None when it cannot be told (an invalid
    spec, or a ``lora`` adapter folder whose ``detector.yaml`` is missing or unreadable and no other judge node)."""
    from halsift.filtering.detectors.spec import family_constant, iter_specs
    from halsift.filtering.detectors.spec_error import SpecError
    from halsift.filtering.models.lora_adapters import read_description

    try:
        nodes = iter_specs(spec)
    except (SpecError, OSError, ValueError):
        return None
    unknown = False
    for _, family, opts in nodes:
        if family_constant(family, "CALLS_JUDGE", False):
            return True
        if family == "lora":
            try:
                if read_description(Path(str(opts.get("path", ""))))["kind"] == "vlm":
                    return True
            except (OSError, ValueError):
                unknown = True
    return None if unknown else False


def judge_spend(folder: str | Path) -> dict[str, Any] | None:
    """``{"judge_calls", "units", "judge_fraction"}`` (the fraction in %, 0–100: calls per unit) of a score
    folder; None when it has no readable manifest or its detector cannot be told (:func:`is_judge_spec`)."""
    folder = Path(folder)
    try:
        m = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(m, Mapping):
        return None
    units = m.get("sentences", m.get("rows"))
    taught = teacher_calls(m.get("detector", ""))
    if isinstance(m.get("cascade"), Mapping):
        c = m["cascade"]
        calls, units, share = c.get("judge_calls"), c.get("units", units), c.get("judge_share")
        if not isinstance(calls, int) or not isinstance(units, int) or taught is None:
            return None
        spent = _spend(calls + taught, units)
        return {**spent, "judge_fraction": float(share)} if isinstance(share, (int, float)) and not taught else spent
    if not isinstance(units, int):
        return None
    if isinstance(m.get("members"), list):  # a recipe ensemble: the mean of its members' folders
        spent = [judge_spend(member) for member in m["members"]]
        return None if any(s is None for s in spent) else _spend(sum(s["judge_calls"] for s in spent), units)
    judge = is_judge_spec(m.get("detector", ""))
    return None if judge is None or taught is None else _spend((units if judge else 0) + taught, units)


def teacher_calls(spec: str | dict) -> int | None:
    """The judge calls spent teaching the distilled students of ``spec`` (each ``student`` node's teacher folder,
    as its ``config.json`` records it): 0 without a student, None when a student's record or teacher cannot be read
    (a spec this module cannot parse counts 0 here: :func:`is_judge_spec` tells)."""
    from halsift.filtering.detectors.spec import iter_specs
    from halsift.filtering.detectors.spec_error import SpecError

    try:
        nodes = iter_specs(spec)
    except (SpecError, OSError, ValueError):
        return 0
    calls = 0
    for _, family, opts in nodes:
        if family != "student":
            continue
        try:
            teacher = json.loads((Path(str(opts.get("path", ""))) / "config.json").read_text())["teacher"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        spent = judge_spend(teacher)
        if spent is None:
            return None
        calls += spent["judge_calls"]
    return calls


def _spend(calls: int, units: int) -> dict[str, Any]:
    return {"judge_calls": int(calls), "units": int(units),
            "judge_fraction": round(ratio_percent(calls, units), 4) if units else float("nan")}
