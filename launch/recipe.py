"""Run a recipe: world -> pretrain -> detectors -> score -> select -> finetune -> eval -> report, in one folder.

The runner only: the stages are objects of ``launch/stages/`` (:data:`halsift.launch.stages.REGISTRY`, in run
order). Each stage writes into ``<run_dir>/<stage>/`` and marks itself complete with
``<run_dir>/<stage>/_done.json`` (written last, atomically), which records a fingerprint of the recipe sections the
stage reads, chained over the stages before it (:func:`stage_fingerprints`).

That marker may only skip: a stage whose fingerprint still matches is skipped. When it no longer matches, the stage
runs again over its folder, and what it made keeps being decided by the execution layer's own identities (each
detector's score parts, each selection, each trained detector and fine-tuning run): adding one detector scores only
that detector, a changed ``dedup.cosine`` re-runs only dedup's global step. Only a stage whose folder has no finer
identity (``Stage.clears``: the base CLIP, the report) is emptied first.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from halsift.corpus.shards import write_json_atomic
from halsift.corpus.config import ConfigError, to_dict
from halsift.corpus.safe_paths import confined_to, remove_tree
from halsift.launch.recipe_config import Recipe
from halsift.launch.stages import REGISTRY, Paths, resolve_paths
from halsift.launch.stage_marker import made_from_holds, mark_stage_done, outputs_hold, stage_record
from halsift.launch.stages.detectors import trained_configs
from halsift.launch.stages.score import check_cascade_aim, detector_specs

log = logging.getLogger("halsift.run")


# ------------------------------------------------------------------------------------------------ checking
def check(r: Recipe) -> Paths:
    """Validate everything that can be checked without loading models (the dry run)."""
    from halsift.filtering.detectors.spec import check_spec, iter_specs
    from halsift.filtering.scoring.cascade import is_cascade
    from halsift.training.clip_config import check_model_name

    p = resolve_paths(r)
    own = {f"detectors.{n}.base": cfg.base for n, cfg in trained_configs(r, p).items() if r.detectors[n].kind == "lora"}
    if r.evals.ihalla is not None and r.evals.ihalla.answerer:
        own["evals.ihalla.answerer"] = r.evals.ihalla.answerer
    for key, spec in own.items():  # the recipe's other spec strings: checked where they are used, noted here
        try:
            _note_privileges(key, iter_specs(spec))
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(f"{key}: {e}") from None
    for name, spec in detector_specs(r, p).items():
        key = f"score.detectors.{name}"
        if spec.endswith((".yaml", ".yml")) and not Path(spec).exists():
            raise ConfigError(f"{key}: spec file {spec} does not exist")
        try:
            nodes = check_spec(spec)  # spec files too: as files a detector loads (filtering/detectors/trust.py)
        except (ValueError, FileNotFoundError) as e:
            raise ConfigError(f"{key}: {e}") from None
        _check_spec_files(key, nodes, p.run)
        _note_privileges(key, nodes)
        if is_cascade(spec):  # aimed at this recipe's cut: refused before any stage runs
            check_cascade_aim(r, name, spec)
    if not r.world.enabled:  # user data must exist now; the world's is produced by the first stage
        for key, path in (("data.corpus", p.source_corpus or p.corpus), ("data.bench", p.bench)):
            if path:
                _check_exists(key, path)
        for name, path in p.retrieval.items():
            _check_exists(f"data.retrieval.{name}", path)
        if r.data.pretrain:
            _check_exists("data.pretrain", r.data.pretrain)
    if r.model.pretrained and ("/" in r.model.pretrained or r.model.pretrained.endswith((".safetensors", ".pt",
                                                                                           ".bin"))):
        _check_exists("model.pretrained", r.model.pretrained)
    try:
        check_model_name(r.model.arch)
    except ValueError as e:
        raise ConfigError(f"model.arch: {e}") from None
    return p


def _note_privileges(key: str, nodes: list) -> None:
    """Say which privileged options a recipe's own spec sets (``--dry-run`` shows them before a shared recipe runs);
    a spec file's were already refused or dropped by :func:`~halsift.filtering.detectors.spec.check_spec`."""
    from halsift.filtering.detectors.trust import privileges

    used = list(dict.fromkeys(u for _, _, opts in nodes for u in privileges(opts)))
    if used:
        print(f"[halsift run] {key}: {', '.join(used)} (written in this recipe: a recipe you did not write can run "
              "a model's own code or send that environment variable to its server)")


def _check_spec_files(key: str, nodes: list, run: Path) -> None:
    """Each local file option of a spec's ``(where, family, options)`` nodes (:func:`check_spec`) exists or is made
    by this run; a clip spec names its weights (:func:`~halsift.filtering.models.clip_models.check_weights`)."""
    from halsift.filtering.detectors.spec import family_constant
    from halsift.filtering.models.clip_models import check_weights

    for _, family, opts in nodes:
        if family == "clip":
            try:
                check_weights(opts.get("arch", "ViT-B-32"), opts.get("pretrained"), opts.get("checkpoint"))
            except ValueError as e:
                raise ConfigError(f"{key}: {e}") from None
        for opt in family_constant(family, "FILE_OPTIONS", ()):  # a file option must exist unless this run makes it
            value = opts.get(opt)
            if value and not Path(str(value)).resolve().is_relative_to(run.resolve()) and not Path(str(value)).exists():
                raise ConfigError(f"{key}: {family} option {opt}={value} does not exist")


def _check_exists(key: str, path: str) -> None:
    import glob

    import braceexpand

    if not any(Path(x).exists() or glob.glob(x) for x in braceexpand.braceexpand(path)):
        raise ConfigError(f"{key}: {path} does not exist")


# ------------------------------------------------------------------------------------------------ running
def stage_fingerprints(r: Recipe) -> dict[str, dict]:
    """Stage -> ``{"fingerprint", "sections"}``: a hash per recipe section the stage reads, and one over those and
    the previous stage's fingerprint (so a change upstream changes every stage after it)."""
    d, chain, out = to_dict(r), "", {}
    for name, stage in REGISTRY.items():
        out[name] = stage.fingerprint(d, chain)
        chain = out[name]["fingerprint"]
    return out


def _changed(saved: dict, now: dict) -> str:
    """Why a completed stage whose fingerprint differs is stale, in words."""
    if "inputs" not in saved:
        return "it was completed by an older halsift that did not record its inputs"
    mine = [k for k, v in now["sections"].items() if saved["inputs"].get("sections", {}).get(k) != v]
    return f"{', '.join(mine)} changed since it ran" if mine else "an earlier stage's inputs changed since it ran"


def _current(r: Recipe, p: Paths, stages: list[str], saved: dict, inputs: dict, force: tuple[str, ...]
             ) -> tuple[list[str], dict[str, str]]:
    """The stages the runner may skip, and why each other completed stage runs again: a stage is complete when its
    marker's fingerprint matches, its folder holds what it left there, it was made from what the stage before it
    (:func:`_before`) holds now (:mod:`~halsift.launch.stage_marker`) and every stage of this run before it is
    complete too (a stage that runs again may change what the next reads: they run again and reuse what holds by
    their own identities)."""
    current, why, earlier = [], {}, None
    for s in stages:
        rec, before = saved[s], _before(r, p, s)
        if rec is not None and s not in force:
            if rec.get("inputs", {}).get("fingerprint") != inputs[s]["fingerprint"]:
                why[s] = _changed(rec, inputs[s])
            elif earlier is not None:
                why[s] = f"{earlier} runs again"
            elif before is not None and not made_from_holds(rec, saved[before] if before in saved
                                                            else stage_record(p.stage(before))):
                why[s] = f"what {before} holds changed since it ran"
            elif not outputs_hold(p.stage(s), rec):
                why[s] = f"{p.stage(s)} changed since it completed"
            else:
                current.append(s)
        if s not in current:
            earlier = earlier or s
    return current, why


def _before(r: Recipe, p: Paths, stage: str) -> str | None:
    """The stage whose folder ``stage`` was made after: the nearest earlier stage the recipe enables that this run
    lists or that has run (a stage run alone still reads what the one before it made; one never run is no link)."""
    chain = [s for s in REGISTRY if REGISTRY[s].enabled(r)]
    for s in reversed(chain[:chain.index(stage)]):
        if s in r.stages or stage_record(p.stage(s)) is not None:
            return s
    return None


def _made_from(r: Recipe, p: Paths, stage: str) -> str | None:
    """The content digest the marker of the stage before ``stage`` records (``None``: none before it, not run, or an
    older marker)."""
    before = _before(r, p, stage)
    outputs = (stage_record(p.stage(before)) or {}).get("outputs") if before else None
    return outputs.get("content") if isinstance(outputs, dict) else None


def run_recipe(r: Recipe, dry_run: bool = False, force: tuple[str, ...] = ()) -> Path:
    """Run (or with ``dry_run`` only check) a recipe; returns the report folder. Nothing outside the run folder is
    removed or replaced (:func:`halsift.corpus.safe_paths.confined_to`)."""
    p = check(r)
    if dry_run:
        return p.stage("report")
    with confined_to(p.run):
        return _run_stages(r, p, force)


def _run_stages(r: Recipe, p: Paths, force: tuple[str, ...]) -> Path:
    from halsift.launch import recipe_ranks

    ranks = recipe_ranks.ranks_from_env()  # under `halsift launch -- run`: score on every rank, the rest on rank 0
    inputs = stage_fingerprints(r)
    stages = [s for s in r.stages if REGISTRY[s].enabled(r)]
    if ranks is not None and not ranks.is_main:
        shared = next(s for s in REGISTRY.values() if s.every_rank)
        recipe_ranks.follow(p.run, ranks, stages, {s: p.stage(s) for s in stages},
                            {s: inputs[s]["fingerprint"] for s in stages}, shared.name,
                            lambda: shared.execute(r, p, ranks))
        return p.stage("report")
    p.run.mkdir(parents=True, exist_ok=True)
    write_json_atomic(p.run / "recipe.resolved.json", to_dict(r))
    import yaml

    (p.run / "recipe.resolved.yaml").write_text(yaml.safe_dump(to_dict(r), sort_keys=False))
    saved = {s: stage_record(p.stage(s)) for s in stages}
    current, why = _current(r, p, stages, saved, inputs, force)
    if ranks is not None:  # the stages the other ranks need not wait for
        recipe_ranks.write_plan(p.run, ranks, current)
    for stage in stages:
        d = p.stage(stage)
        if stage in current:
            log.info("stage %s: complete, skipped", stage)
            print(f"[halsift run] {stage}: already complete, skipped")
            continue
        if stage in force and d.exists():
            print(f"[halsift run] {stage}: forced; clearing {d} and re-running")
            remove_tree(d)
        elif saved[stage] is not None and REGISTRY[stage].clears:
            print(f"[halsift run] {stage}: {why[stage]}; clearing {d} and re-running")
            remove_tree(d)
        elif saved[stage] is not None:
            print(f"[halsift run] {stage}: {why[stage]}; re-running (what still holds by its own identity is reused)")
        print(f"[halsift run] {stage}: running")
        started = time.time()
        try:
            with recipe_ranks.stage_scope(ranks, REGISTRY[stage].every_rank):  # rank 0: score with every rank
                info = REGISTRY[stage].execute(r, p, ranks)  # (the stage's `every_rank`), any other stage alone
        except BaseException as e:
            if ranks is not None:
                recipe_ranks.write_failure(p.run, ranks, stage, e)
            raise
        mark_stage_done(d, {**info, **({"launch": ranks.launch} if ranks else {})}, time.time() - started,
                        inputs[stage], made_from=_made_from(r, p, stage))
        print(f"[halsift run] {stage}: done in {time.time() - started:.1f}s")
    return p.stage("report")
