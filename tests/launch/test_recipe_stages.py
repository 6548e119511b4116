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
# either change only how scoring runs or are at their default here, so the fingerprints may not change. Issue 50 made
# batch_size and max_parse_failures run-only for recipes too (one list with `halsift score`, execution/flags.RUN_ONLY):
# on purpose, an existing run folder re-runs its score stage once after that upgrade, reusing every part
OLD_SECTION_FIELDS = {"score": ("unit", "detectors", "ensembles"),
                      # issue 42: dedup gained its engine flags (engine, address, workers, decode_workers): run-only
                      "dedup": ("against", "model", "exact_on", "phash_distance", "near_thumbnail", "eval_thumbnail",
                                "cosine", "nprobe", "enabled", "allow_implausible")}


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
    for key in ("pretrain", "finetune"):  # issue 52: cache_mb (run-only) added to train clip's settings
        d[key].pop("cache_mb")
    for stage, keys in OLD_STAGE_INPUTS.items():
        sections = {k: sha(lookup(d, k)) for k in keys}
        chain = sha([chain, sections])
        out[stage] = {"fingerprint": chain, "sections": sections}
    return out


# A change to one recipe key re-runs the stage(s) that read it and every stage after them, and nothing before:
# (override, the first stage it re-runs). Keys no stage reads (run_dir) re-run nothing.
RERUNS = [
    ("seed=1", "world"), ("world.images=100", "world"), ("data.pretrain=x", "pretrain"),
    ("model.arch=ViT-B-32", "pretrain"), ("pretrain.steps=5", "pretrain"), ("pretrain.lr=0.5", "pretrain"),
    ("detectors.clip-lora.options.steps=3", "detectors"), ("dedup.enabled=false", "dedup"), ("dedup.allow_implausible=true", "dedup"),
    ("score.unit=caption", "score"), ("eval.bench_split=val", "score"), ("select.keep=0.5", "select"),
    ("finetune.seeds=[0,1,2]", "finetune"), ("finetune.warmup=3", "finetune"), ("eval.keep=0.5", "eval"),
    ("evals.ihalla.prompts=10", "eval"), ("name=other", "report"), ("run_dir={tmp}/elsewhere", None),
]


@pytest.mark.parametrize("override, first", RERUNS, ids=[o for o, _ in RERUNS])
def test_a_change_reruns_its_stage_and_the_ones_after_it(tmp_path, override, first):
    before = stage_fingerprints(load_recipe("quickstart", [f"run_dir={tmp_path}"]))
    after = stage_fingerprints(load_recipe("quickstart", [f"run_dir={tmp_path}",
                                                          override.replace("{tmp}", str(tmp_path))]))
    changed = [s for s in REGISTRY if before[s]["fingerprint"] != after[s]["fingerprint"]]
    assert changed == (list(REGISTRY)[list(REGISTRY).index(first):] if first else []), override
    if first:  # it re-runs because a section it reads moved, not only through the chain
        assert before[first]["sections"] != after[first]["sections"], override


def test_the_quickstart_fingerprints_are_stable_and_chained(tmp_path):
    """The same recipe loaded twice (in another run_dir) hashes alike; each fingerprint covers the one before."""
    one = stage_fingerprints(load_recipe("quickstart", [f"run_dir={tmp_path}/a"]))
    two = stage_fingerprints(load_recipe("quickstart", [f"run_dir={tmp_path}/b"]))
    assert one == two and len({v["fingerprint"] for v in one.values()}) == len(one)


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
    assert "extra: eval.keep changed since it ran; re-running" in capsys.readouterr().out and calls == [0.2, 0.5]
    # re-run over its folder (a stage without a finer identity says clears=True), which --force empties
    assert (run / "extra" / "stale.txt").exists() and (run / "extra" / "made.txt").read_text() == "0.5"

    assert main([*args, "eval.keep=0.5", "--force", "extra"]) == 0
    assert calls == [0.2, 0.5, 0.5] and not (run / "never").exists() and not (run / "extra" / "stale.txt").exists()
    assert main([*args, "--force", "nosuch"]) == 2
    assert "--force: unknown stage 'nosuch'" in capsys.readouterr().err
