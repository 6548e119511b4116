"""The recipe stages as objects (launch/stages/): one module and one registry entry each, the same fingerprints as
the runner that found its stages through ``globals()``, and a stage added to the registry runs, skips and re-runs
through the runner with nothing else changed."""

from __future__ import annotations

import ast
import hashlib
import json
from pathlib import Path

import pytest

from halsift.launch.cli import main
from halsift.launch.cmd_run import load_recipe, shipped_recipes
from halsift.launch.recipe import stage_fingerprints
from halsift.launch.stages import REGISTRY, Stage

STAGES_DIR = Path(__file__).parents[2] / "launch" / "stages"
ORDER = ["world", "pretrain", "detectors", "dedup", "score", "select", "finetune", "eval", "report"]

# launch/recipe_config.STAGE_INPUTS and launch/recipe.stage_fingerprints at 608b057, before the stages became
# objects, copied here only to compare: the registry must hash the same sections in the same chain, or every
# existing run folder would re-run from its first stage.
OLD_STAGE_INPUTS = {"world": ("seed", "world"), "pretrain": ("data", "model", "pretrain"),
                    "detectors": ("detectors",), "dedup": ("dedup",), "score": ("score", "eval.bench_split"),
                    "select": ("select",), "finetune": ("finetune",), "eval": ("eval", "evals"), "report": ("name",)}
# the score section's fields at that commit: the fields it gained since (the rest of `halsift score`'s settings)
# either change only how scoring runs or are at their default here, so the fingerprints may not change
OLD_SECTION_FIELDS = {"score": ("unit", "batch_size", "max_parse_failures", "detectors", "ensembles"),
                      # issue 42: dedup gained its engine flags (engine, address, workers, decode_workers): run-only
                      "dedup": ("against", "model", "exact_on", "phash_distance", "near_thumbnail", "eval_thumbnail",
                                "cosine", "nprobe", "enabled")}


def old_stage_fingerprints(r) -> dict[str, dict]:
    from halsift.corpus.config import to_dict

    def sha(obj) -> str:
        return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]

    def lookup(d, dotted):
        for part in dotted.split("."):
            d = d.get(part) if isinstance(d, dict) else None
        return d

    d, chain, out = to_dict(r), "", {}
    for key, names in OLD_SECTION_FIELDS.items():
        d[key] = {n: d[key][n] for n in names}
    for stage, keys in OLD_STAGE_INPUTS.items():
        sections = {k: sha(lookup(d, k)) for k in keys}
        chain = sha([chain, sections])
        out[stage] = {"fingerprint": chain, "sections": sections}
    return out


# `stage_fingerprints(load_recipe("quickstart", ["run_dir=/tmp/x"]))` printed by the old runner at 608b057 (run_dir
# is no input). They change, legitimately, when a field or default of a hashed section changes: then recompute them
# with old_stage_fingerprints above and say so in the commit (existing run folders re-run from that stage).
# Since 608b057: the score section gained `max_parse_failures` (issue 35), so score and every stage after it moved;
# the select section became `halsift select`'s fields (top_k's default 0 -> null, the command's) and gained the
# composed-selection and guaranteed-selection keys (issues 31, 32), so select and every stage after it moved;
# issue 33: world gained zeroshot_images / compositional_images, data gained zeroshot / compositional, eval gained
# zeroshot / compositional: every stage moved (existing runs re-run from the world stage, which writes the new sets).
# issue 31: the world gained leaks/exact_copies (quickstart plants them) and the dedup stage runs before score.
QUICKSTART = {
    "world": ("675df6377f8743d2", {"seed": "5feceb66ffc86f38", "world": "2aabc6b38e1e6713"}),
    "pretrain": ("908371d53b1e8407", {"data": "cef95a3a080af27b",
                                      "model": "980c750c33c77a7a", "pretrain": "0ff8129adb5f1f21"}),
    "detectors": ("23ed05a718f29511", {"detectors": "ffedc5abd8f933dc"}),
    "dedup": ("ca0a8a7647441b36", {"dedup": "8133a4627afecaf5"}),
    "score": ("b1b02a9a6f77db9a", {"score": "9c1267a0eb192137", "eval.bench_split": "4d967a30111bf29f"}),
    "select": ("00ab04934655115f", {"select": "f3463167872114d3"}),
    "finetune": ("73991962668db7c4", {"finetune": "326249b506be0f30"}),
    "eval": ("36134b744ec496af", {"eval": "2a954114747a80c9", "evals": "566be1eec8e9a06e"}),
    "report": ("59d284890a1dbaa5", {"name": "9cff4eeb32be37bd"}),
}


def test_quickstart_fingerprints_are_the_old_runners(tmp_path):
    got = stage_fingerprints(load_recipe("quickstart", [f"run_dir={tmp_path}"]))
    assert {s: (got[s]["fingerprint"], got[s]["sections"]) for s in QUICKSTART} == QUICKSTART


@pytest.mark.parametrize("name,overrides", [(n, []) for n in sorted(shipped_recipes())] + [
    ("quickstart", ["eval.bench_split=val"]), ("quickstart", ["select.keep=0.5", "seed=3"]),
    ("compare_filters", ["evals.vope={synthetic: true}", "finetune.seeds=[0, 1]"])])
def test_fingerprints_equal_the_old_runners_for_every_shipped_recipe(tmp_path, name, overrides):
    r = load_recipe(name, [f"run_dir={tmp_path}", *overrides])
    got = stage_fingerprints(r)
    assert {s: got[s] for s in OLD_STAGE_INPUTS} == old_stage_fingerprints(r)


def test_the_registry_is_the_run_order_and_every_stage_module_is_in_it():
    import importlib

    from halsift.launch.recipe_config import STAGES

    assert [s for s in REGISTRY if s in ORDER] == ORDER and STAGES == tuple(REGISTRY)
    modules = sorted(f.stem for f in STAGES_DIR.glob("*.py") if f.stem not in ("__init__", "base", "shared"))
    assert modules == sorted(REGISTRY)  # a stage module left out of the registry would never run
    for name in REGISTRY:
        stage = importlib.import_module(f"halsift.launch.stages.{name}").STAGE
        assert stage is REGISTRY[name] and stage.name == name
        assert stage.inputs == OLD_STAGE_INPUTS.get(name, stage.inputs)
    assert [s.name for s in REGISTRY.values() if s.every_rank] == ["score"]  # launch/recipe_ranks.py: one at most


def test_a_stage_module_imports_only_the_stages_before_it():
    """What a stage reads of another stage (its folders, its names) comes from an earlier stage, never a later one."""
    order = list(REGISTRY)
    for name in order:
        tree = ast.parse((STAGES_DIR / f"{name}.py").read_text())
        imported = {n.module.rsplit(".", 1)[-1] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                    and (n.module or "").startswith("halsift.launch.stages.")}
        later = [m for m in imported if m in order and order.index(m) >= order.index(name)]
        assert not later, f"launch/stages/{name}.py imports the later stage(s) {later}"


def test_world_is_left_out_when_disabled(tmp_path):
    r = load_recipe("quickstart", [f"run_dir={tmp_path}"])
    assert all(s.enabled(r) for s in REGISTRY.values())
    r.world.enabled = False
    assert [n for n, s in REGISTRY.items() if not s.enabled(r)] == ["world"]


def test_a_stage_added_to_the_registry_runs_skips_and_reruns(tmp_path, monkeypatch, capsys):
    """Adding a stage is its module's `STAGE` and its registry entry: the runner, `--force` and the fingerprint
    chain take it with no other change; a stage whose `enabled` says no is left out (no folder, no `_done.json`)."""
    import halsift.launch.recipe_config as recipe_config

    calls = []

    def stage_extra(r, p) -> dict:
        calls.append(r.eval.keep)
        p.stage("extra").mkdir(parents=True, exist_ok=True)
        (p.stage("extra") / "made.txt").write_text(str(r.eval.keep))
        return {"keep": r.eval.keep}

    monkeypatch.setitem(REGISTRY, "extra", Stage("extra", ("eval.keep",), stage_extra))
    monkeypatch.setitem(REGISTRY, "never", Stage("never", ("name",), stage_extra, enabled=lambda r: False))
    monkeypatch.setattr(recipe_config, "STAGES", tuple(REGISTRY))
    run = tmp_path / "run"
    recipe = tmp_path / "extra.yaml"
    recipe.write_text(f"run_dir: {run}\nstages: [extra, never]\nscore: {{detectors: {{r: 'random:seed=0'}}}}\n")
    args = ["run", str(recipe)]

    assert main(args) == 0
    done = json.loads((run / "extra" / "_done.json").read_text())
    fingerprints = stage_fingerprints(load_recipe(str(recipe), []))
    assert list(fingerprints)[-2:] == ["extra", "never"]
    assert done["keep"] == 0.2 and done["inputs"] == fingerprints["extra"] and calls == [0.2]
    assert not (run / "never").exists()

    capsys.readouterr()
    assert main(args) == 0
    assert "extra: already complete, skipped" in capsys.readouterr().out and calls == [0.2]

    (run / "extra" / "stale.txt").write_text("made with the old settings")
    assert main([*args, "eval.keep=0.5"]) == 0
    assert "extra: eval.keep changed since it ran; clearing" in capsys.readouterr().out and calls == [0.2, 0.5]
    assert not (run / "extra" / "stale.txt").exists() and (run / "extra" / "made.txt").read_text() == "0.5"

    assert main([*args, "eval.keep=0.5", "--force", "extra"]) == 0
    assert calls == [0.2, 0.5, 0.5] and not (run / "never").exists()
    assert main([*args, "--force", "nosuch"]) == 2
    assert "--force: unknown stage 'nosuch'" in capsys.readouterr().err
