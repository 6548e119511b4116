"""Run a recipe: world -> pretrain -> detectors -> score -> select -> finetune -> eval -> report, in one folder.

Reads top to bottom like the loop it runs. Each stage writes into ``<run_dir>/<stage>/`` and marks itself
complete with ``<run_dir>/<stage>/_done.json`` (written last, atomically); a rerun skips complete stages, and
the stages themselves skip their finished parts (score parts, checkpoints), so a killed run resumes.

``_done.json`` also records a fingerprint of the recipe sections the stage reads, chained over the stages before
it (:func:`stage_fingerprints`). When it no longer matches, the stage's folder is cleared (its parts were made
from other settings) and the stage re-runs, and so, through the chain, does every stage after it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from halsift.corpus.shards import write_json_atomic
from halsift.corpus.config import ConfigError, to_dict
from halsift.corpus.safe_paths import confined_to, remove_file, remove_tree, safe_component
from halsift.launch.recipe_config import STAGE_INPUTS, STAGES, Recipe

log = logging.getLogger("halsift.run")


@dataclass
class Paths:
    """Where each stage reads and writes, resolved once from the recipe."""

    run: Path
    corpus: str
    bench: str
    retrieval: dict[str, str]
    pretrain_data: str
    base: str  # base CLIP weights (pretrained tag or file), '' until the pretrain stage has run

    def stage(self, name: str) -> Path:
        return self.run / name

    def named(self, stage: str, name: str) -> Path:
        """``<run>/<stage>/<name>`` for a recipe name (a detector, ensemble, variant): refused unless ``name`` is one
        safe path component, so no recipe builds a path outside the run folder (the config checks it first)."""
        return self.stage(stage) / safe_component(name, stage)


def resolve_paths(r: Recipe) -> Paths:
    run = Path(r.run_dir)
    world = run / "world"
    corpus = r.data.corpus or (str(world / "corpus") if r.world.enabled else "")
    bench = r.data.bench or (str(world / "bench" / "bench.jsonl") if r.world.enabled else "")
    retrieval = dict(r.data.retrieval) or ({"synthetic": str(world / "retrieval")} if r.world.enabled else {})
    pretrain = r.data.pretrain or (str(world / "pretrain") if r.world.enabled else "")
    base = r.model.pretrained or str(run / "pretrain" / "final" / "open_clip_model.safetensors")
    return Paths(run, corpus, bench, retrieval, pretrain, base)


def trained_spec(r: Recipe, p: Paths, name: str) -> str:
    """The ``lora:DIR`` spec the detectors stage produces for ``detectors.NAME``; with ``trust_remote_code=true``
    when the recipe's own ``detectors.NAME.base`` has it (the adapter folder's ``detector.yaml`` never grants it)."""
    out = p.named("detectors", name)
    if r.detectors[name].kind == "world_judge":
        from halsift.synth.world_judge_config import world_judge_spec

        return world_judge_spec(out, trained_configs(r, p)[name])
    return f"lora:{out / 'adapter'}" + (",trust_remote_code=true" if _base_grants_remote_code(r, p, name) else "")


def _base_grants_remote_code(r: Recipe, p: Paths, name: str) -> bool:
    from halsift.filtering.detectors.spec import parse_spec

    subs = {"run_dir": str(p.run), "base": p.base, "arch": r.model.arch}
    try:
        _, opts = parse_spec(_substitute(r.detectors[name].base, f"detectors.{name}.base", subs))
    except ValueError:  # a malformed base is reported by the detectors stage's own validation
        return False
    return opts.get("trust_remote_code") is True


class _Trained:
    """``{trained.NAME}`` in a spec: the trained detector's spec; an unknown NAME is a config error."""

    def __init__(self, specs: dict[str, str], where: str) -> None:
        self._specs, self._where = specs, where

    def __getattr__(self, name: str) -> str:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._specs:
            raise ConfigError(f"{self._where}: {{trained.{name}}} names no entry of detectors "
                              f"(known: {sorted(self._specs)})")
        return self._specs[name]


def _substitute(spec: str, where: str, subs: dict) -> str:
    try:
        return spec.format(**subs)
    except KeyError as e:
        raise ConfigError(f"{where}: unknown placeholder {{{e.args[0]}}}; known: {sorted(subs)}") from None
    except (ValueError, IndexError) as e:
        raise ConfigError(f"{where}: bad placeholder in {spec!r} ({e})") from None


def detector_specs(r: Recipe, p: Paths) -> dict[str, str]:
    """Detector name -> spec with ``{run_dir}``, ``{base}``, ``{arch}`` and ``{trained.NAME}`` substituted."""
    subs = {"run_dir": str(p.run), "base": p.base, "arch": r.model.arch}
    trained = {name: trained_spec(r, p, name) for name in r.detectors}
    return {name: _substitute(spec, f"score.detectors.{name}", {**subs, "trained": _Trained(trained,
                                                                 f"score.detectors.{name}")})
            for name, spec in r.score.detectors.items()}


def trained_configs(r: Recipe, p: Paths) -> dict:
    """``detectors.NAME`` -> a validated ``DetectorTrainConfig`` (lora) or ``WorldJudgeSettings`` (world_judge)."""
    from halsift.corpus.config import from_dict
    from halsift.training.detector_config import DetectorTrainConfig
    from halsift.synth.world_judge_config import WorldJudgeSettings

    subs = {"run_dir": str(p.run), "base": p.base, "arch": r.model.arch}
    out = {}
    for name, t in r.detectors.items():
        where = f"detectors.{name}.options"
        if t.kind == "world_judge":  # string options may name {base} / {arch} (vision_from, vision_arch)
            opts = {k: _substitute(v, f"{where}.{k}", subs) if isinstance(v, str) else v
                    for k, v in t.options.items()}
            out[name] = from_dict(WorldJudgeSettings, opts, prefix=where)
            continue
        if not p.bench:
            raise ConfigError(f"detectors.{name}: kind lora trains on a bench; set data.bench")
        fixed = {"base": _substitute(t.base, f"detectors.{name}.base", subs), "bench": p.bench,
                 "out": str(p.named("detectors", name)), "seed": r.seed, "resume": True,
                 "wandb_mode": r.wandb.mode, "wandb_project": r.wandb.project, "wandb_run": f"{r.name}-{name}"}
        out[name] = from_dict(DetectorTrainConfig, {**fixed, **t.options}, prefix=where)
    return out


def check(r: Recipe) -> Paths:
    """Validate everything that can be checked without loading models (the dry run)."""
    from halsift.filtering.detectors.spec import check_spec, iter_specs
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
    if not r.world.enabled:  # user data must exist now; the world's is produced by the first stage
        for key, path in (("data.corpus", p.corpus), ("data.bench", p.bench)):
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


# detector options that name a local file or folder: it must exist unless a stage of this run makes it
_FILE_OPTIONS = {"clip": ("checkpoint",), "lora": ("path",)}


def _check_spec_files(key: str, nodes: list, run: Path) -> None:
    """Each local file option of a spec's ``(where, family, options)`` nodes (:func:`check_spec`) exists or is made
    by this run; a clip spec names its weights (:func:`~halsift.filtering.detectors.clip.check_weights`)."""
    from halsift.filtering.detectors.clip import check_weights

    for _, family, opts in nodes:
        if family == "clip":
            try:
                check_weights(opts.get("arch", "ViT-B-32"), opts.get("pretrained"), opts.get("checkpoint"))
            except ValueError as e:
                raise ConfigError(f"{key}: {e}") from None
        for opt in _FILE_OPTIONS.get(family, ()):
            value = opts.get(opt)
            if value and not Path(str(value)).resolve().is_relative_to(run.resolve()) and not Path(str(value)).exists():
                raise ConfigError(f"{key}: {family} option {opt}={value} does not exist")


def _check_exists(key: str, path: str) -> None:
    import glob

    import braceexpand

    if not any(Path(x).exists() or glob.glob(x) for x in braceexpand.braceexpand(path)):
        raise ConfigError(f"{key}: {path} does not exist")


# ------------------------------------------------------------------------------------------------ stages
# recipe_config.STAGE_INPUTS: the recipe sections each stage reads itself (what earlier stages produced comes in
# through the fingerprint chain); each stage is the function stage_<name> below.


def _sha(obj) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _lookup(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def stage_fingerprints(r: Recipe) -> dict[str, dict]:
    """Stage -> ``{"fingerprint", "sections"}``: a hash per recipe section the stage reads, and one over those and
    the previous stage's fingerprint (so a change upstream changes every stage after it)."""
    d, chain, out = to_dict(r), "", {}
    for stage, keys in STAGE_INPUTS.items():
        sections = {k: _sha(_lookup(d, k)) for k in keys}
        chain = _sha([chain, sections])
        out[stage] = {"fingerprint": chain, "sections": sections}
    return out


def _done(stage_dir: Path) -> dict | None:
    """The stage's ``_done.json`` record, or None when it has not completed."""
    f = stage_dir / "_done.json"
    return json.loads(f.read_text()) if f.exists() else None


def _mark_done(stage_dir: Path, info: dict, started: float, inputs: dict) -> None:
    stage_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(stage_dir / "_done.json", {**info, "inputs": inputs, "wall_s": round(time.time() - started, 2)})


def _changed(saved: dict, now: dict) -> str:
    """Why a completed stage is stale, in words."""
    if "inputs" not in saved:
        return "it was completed by an older halsift that did not record its inputs"
    mine = [k for k, v in now["sections"].items() if saved["inputs"].get("sections", {}).get(k) != v]
    return f"{', '.join(mine)} changed" if mine else "an earlier stage's inputs changed"


def stage_world(r: Recipe, p: Paths) -> dict:
    from halsift.synth.world import generate_world

    info = generate_world(p.stage("world"), seed=r.seed, overwrite=True, **r.world.generator_kwargs())
    return {"world": info if isinstance(info, dict) else {}}


def bench_subset(bench: str, split: str, out: Path) -> str:
    """``bench`` restricted to one split, written under ``out`` with absolute image paths ('' if none left), and
    the folders they may be in (the bench's own and its ``image_roots.json``'s) in the subset's ``image_roots.json``.

    The cached subset records the fingerprint of the bench it was cut from (``source.json``); it is rebuilt
    whenever that bench (path or content) changed, so a new ``data.bench`` never meets the old rows."""
    from halsift.corpus.bench import image_roots, iter_bench, write_bench, write_image_roots
    from halsift.corpus.fingerprint import path_fingerprint

    if not bench or split == "none":
        return ""
    if not split:
        return bench
    target = out / f"bench_{safe_component(split, 'bench_split', is_key=False)}" / "bench.jsonl"
    source = target.with_name("source.json")
    ident = {"bench": str(Path(bench).resolve()), "split": split, "fingerprint": path_fingerprint(bench)}
    try:
        cached = json.loads(source.read_text()) == ident and target.exists()
    except (OSError, ValueError):
        cached = False
    if not cached:
        remove_file(source)
        remove_file(target)
        root = image_roots(bench)[0]  # normalised as the image check normalises it (symlinks kept)
        rows = []
        for row in iter_bench(bench):
            if row.split == split:
                row.image = os.path.normpath(root / row.image)
                rows.append(row)
        if not rows:
            return ""
        write_bench(target, rows)
        write_json_atomic(source, ident)
    write_image_roots(target, image_roots(bench))
    return str(target)


def _train_cfg(r: Recipe, t, data: list[str], out: Path, pretrained: str, seed: int):
    first_retrieval = next(iter(_retrieval_sets(r, resolve_paths(r)).values()), "")
    bench = bench_subset(resolve_paths(r).bench, t.bench_split, Path(r.run_dir))
    return t.clip_train_config(data=data, out=str(out), model=r.model.arch, pretrained=pretrained,
                               retrieval=first_retrieval, bench=bench, eval_batch_size=r.eval.batch_size, seed=seed,
                               wandb_mode=r.wandb.mode, wandb_project=r.wandb.project,
                               wandb_run=f"{r.name}-{out.parent.name}-{out.name}", resume=True)


def _retrieval_sets(r: Recipe, p: Paths) -> dict[str, str]:
    return {name: path for name, path in p.retrieval.items()}


def stage_pretrain(r: Recipe, p: Paths) -> dict:
    from halsift.training.clip_train import train

    if r.model.pretrained or not r.pretrain.enabled:
        return {"skipped": "model.pretrained is set" if r.model.pretrained else "pretrain.enabled is false"}
    cfg = _train_cfg(r, r.pretrain, [p.pretrain_data], p.stage("pretrain"), "", r.seed)
    return {"metrics": train(cfg)}


def stage_detectors(r: Recipe, p: Paths) -> dict:
    """Train each ``detectors`` entry (a finished one is reused: its adapter, or the judge's cache record)."""
    from halsift.training.detector_train import train_detector
    from halsift.synth.world_judge import build_world_judge

    info = {}
    for name, cfg in trained_configs(r, p).items():
        spec = trained_spec(r, p, name)
        out = p.named("detectors", name)
        started = time.time()
        if r.detectors[name].kind == "world_judge":
            built = build_world_judge(p.stage("world"), out, seed=r.seed, settings=cfg, show_progress=True)
            assert built == spec, (built, spec)
        elif not (out / "adapter" / "detector.yaml").exists():
            train_detector(cfg)
        print(f"[halsift run] detectors.{name}: {spec} ({time.time() - started:.1f}s)")
        info[name] = spec
    return {"trained": info}


def _scores_dir(p: Paths, name: str, what: str) -> Path:
    return p.named("score", name) / what


def stage_score(r: Recipe, p: Paths, ranks=None) -> dict:
    """Score the corpus and the bench with every detector; under ``halsift launch`` on every rank (``ranks``: see
    :mod:`halsift.launch.recipe_ranks`), each scoring its share of the parts; the ensembles on rank 0."""
    from halsift.filtering.scoring.runner import score, score_bench
    from halsift.filtering.detectors.spec import load_detector
    from halsift.launch.recipe_ranks import main_process_first

    info = {}
    with main_process_first(ranks):  # rank 0 cuts the bench subset, the others then read it
        bench = bench_subset(p.bench, r.eval.bench_split, p.run)  # only the rows the eval stage reads
    for name, spec in detector_specs(r, p).items():
        detector = load_detector(spec)
        if p.corpus and "select" in r.stages:
            score(detector, p.corpus, _scores_dir(p, name, "corpus"), unit=r.score.unit,
                  batch_size=r.score.batch_size, max_parse_failures=r.score.max_parse_failures)
        if bench:
            score_bench(detector, bench, _scores_dir(p, name, "bench"), max_parse_failures=r.score.max_parse_failures)
        info[name] = spec
        del detector
    if ranks is not None and not ranks.is_main:
        return {"detectors": info}
    for name, members in r.score.ensembles.items():
        for what in ("corpus", "bench"):
            if not all(_scores_dir(p, m, what).exists() for m in members):
                continue
            write_ensemble(name, [_scores_dir(p, m, what) for m in members], _scores_dir(p, name, what))
        info[name] = "mean(" + ", ".join(members) + ")"
    _log_stage(r, p, "score", {n: _scores_dir(p, n, "corpus") for n in info})
    return {"detectors": info}


def _log_stage(r: Recipe, p: Paths, stage: str, folders: dict[str, Path]) -> None:
    """The score / select stage's figures as one wandb run (``launch/run_wandb.py``) unless wandb is disabled."""
    if r.wandb.mode != "disabled" and folders:
        from halsift.launch.run_wandb import log_recipe_stage

        log_recipe_stage(stage, p.stage(stage), folders, r.wandb.mode, r.wandb.project, r.name)


def write_ensemble(name: str, member_dirs: list[Path], out: Path) -> None:
    """Mean of member scores (:func:`halsift.filtering.detectors.ensemble.combine`, equal weights, no normalisation) per
    (key, sentence_index) all members scored, written as a score folder (seeds' Table 6 ensembles)."""
    from halsift.corpus.scores import read_scores_df, scores_table, write_part_atomic
    from halsift.filtering.detectors.ensemble import combine

    merged = None
    for i, d in enumerate(member_dirs):
        df = read_scores_df(d, ["key", "sentence_index", "score", "parsed"]).rename(
            columns={"score": f"s{i}", "parsed": f"p{i}"})
        merged = df if merged is None else merged.merge(df, on=["key", "sentence_index"], how="inner")
    cols = [f"s{i}" for i in range(len(member_dirs))]
    merged = merged.sort_values(["key", "sentence_index"]).reset_index(drop=True)
    out.mkdir(parents=True, exist_ok=True)
    parsed = merged[[f"p{i}" for i in range(len(member_dirs))]].all(axis=1)
    scores = combine(merged[cols].to_numpy(dtype=float).T, [1.0] * len(cols), "none")
    table = scores_table(merged["key"], merged["sentence_index"], scores, parsed, name)
    write_part_atomic(table, out / "part-ensemble.parquet")
    write_json_atomic(out / "_manifest.json", {"detector": name, "detector_name": name, "status": "complete",
                                               "part_files": ["part-ensemble.parquet"],
                                               "members": [str(d) for d in member_dirs],
                                               "rows": int(len(merged)), "complete": True})


def _scored(r: Recipe) -> list[str]:
    """Detectors and ensembles: the names with score folders."""
    return list(r.score.detectors) + list(r.score.ensembles)


def _filters(r: Recipe) -> list[str]:
    """Every selection that is fine-tuned and compared: the scored names, then ``select.variants``."""
    return _scored(r) + list(r.select.variants)


def stage_select(r: Recipe, p: Paths) -> dict:
    from halsift.filtering.selection.select import select
    from halsift.filtering.selection.resumable import reuse_or_clear

    info = {}
    for name in _filters(r):
        scored, how = r.select.resolved(name)
        done = reuse_or_clear(p.named("select", name), _scores_dir(p, scored, "corpus"), **how,
                              per_captioner=r.select.per_captioner, seed=r.seed)
        if done is not None:  # finished before the stage was killed; a half-written one was cleared above
            info[name] = done
            continue
        manifest = select(_scores_dir(p, scored, "corpus"), p.corpus, p.named("select", name), **how,
                          per_captioner=r.select.per_captioner, seed=r.seed,
                          meta_defaults={"captioner": r.select.captioner, "source": r.select.source})
        info[name] = manifest
    _log_stage(r, p, "select", {name: p.named("select", name) for name in info})
    return {"selections": info}


def _finetune_runs(r: Recipe, p: Paths) -> dict[str, list[Path]]:
    runs = {name: [p.named("finetune", name) / f"seed{s}" for s in r.finetune.seeds] for name in _filters(r)}
    if r.finetune.unfiltered:
        runs["unfiltered"] = [p.stage("finetune") / "unfiltered" / f"seed{s}" for s in r.finetune.seeds]
    return runs


def stage_finetune(r: Recipe, p: Paths) -> dict:
    from halsift.training.clip_train import train

    todo = {}
    for name, runs in _finetune_runs(r, p).items():
        data = [p.corpus] if name == "unfiltered" else [str(p.named("select", name))]
        for run_dir, seed in zip(runs, r.finetune.seeds):
            if not (run_dir / "final" / "open_clip_model.safetensors").exists():
                todo[f"{name}/seed{seed}"] = _train_cfg(r, r.finetune, data, run_dir, p.base, seed)
    jobs = _finetune_jobs(r, len(todo))
    if jobs == 1:
        done = {k: train(cfg) for k, cfg in todo.items()}
    else:  # independent runs: one single-threaded process per core beats one run with every thread (tiny models)
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        print(f"[halsift run] finetune: {len(todo)} runs, {jobs} at a time (one thread each)", flush=True)
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {k: pool.submit(_train_single_threaded, cfg, p.run) for k, cfg in todo.items()}
            done = {k: f.result() for k, f in futures.items()}
    return {"runs": sorted(done)}


def _finetune_jobs(r: Recipe, runs: int) -> int:
    """Fine-tuning runs at once: ``finetune.jobs`` (0: the cores) on a CPU device outside a multi-process launch,
    else 1."""
    if runs < 2 or _device(r) != "cpu" or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return 1
    return max(1, min(r.finetune.jobs or os.cpu_count() or 1, runs))


def _train_single_threaded(cfg, run: Path) -> dict:
    """``train(cfg)`` in a worker process with one intra-op thread, so that concurrent runs share the cores; like
    the parent, it removes nothing outside the run folder."""
    import torch

    from halsift.training.clip_train import train

    torch.set_num_threads(1)
    with confined_to(run):
        return train(cfg)


def _device(r: Recipe) -> str:
    import torch

    if r.device != "auto":
        return r.device
    return "cuda" if torch.cuda.is_available() and not os.environ.get("HALSIFT_FORCE_CPU") else "cpu"


def stage_eval(r: Recipe, p: Paths) -> dict:
    import torch

    from halsift.corpus.scores import read_scores_df
    from halsift.eval.runs.bench_eval import evaluate_bench
    from halsift.eval.metrics.retrieval import evaluate_retrieval, ranks_key, write_ranks
    from halsift.filtering.detectors.clip import load_open_clip
    from halsift.filtering.detectors.clip_tokenizer import get_tokenizer

    out_dir = p.stage("eval")
    out_dir.mkdir(parents=True, exist_ok=True)
    bench_metrics = {}
    if p.bench and "score" in r.stages:
        scores = {name: read_scores_df(_scores_dir(p, name, "bench")) for name in _scored(r)}
        bench = bench_subset(p.bench, r.eval.bench_split, p.run)
        if not bench:
            raise ConfigError(f"eval.bench_split: no rows of split {r.eval.bench_split!r} in {p.bench}")
        bench_metrics = evaluate_bench(bench, scores, out_dir / "bench", keep=r.eval.keep, seed=r.seed)
    device = _device(r)
    models = {"no-tune": [p.base]} if r.finetune.no_tune and p.retrieval else {}
    if "finetune" in r.stages and p.retrieval:
        for name, runs in _finetune_runs(r, p).items():
            models[name] = [str(d / "final" / "open_clip_model.safetensors") for d in runs]
    retrieval: dict[str, list[dict]] = {}
    ranks = {}  # per-query ranks of every model, for the report's bootstrap CIs
    for name, weights in models.items():
        for i, w in enumerate(weights):
            model, _, preprocess = load_open_clip(r.model.arch, pretrained=w, device=device)
            tokenizer = get_tokenizer(r.model.arch)
            model.eval()
            res = {}
            for set_name, path in _retrieval_sets(r, p).items():
                with torch.no_grad():
                    m, rk = evaluate_retrieval(model, preprocess, tokenizer, path, device, r.eval.batch_size,
                                               return_ranks=True, precision=r.finetune.precision)
                res.update({f"{set_name}/{k}": v for k, v in m.items()})
                ranks.update({ranks_key(name, i, set_name, d): rk[d] for d in ("i2t", "t2i")})
                ranks[f"{set_name}/text_to_image"] = rk["text_to_image"]
            retrieval.setdefault(name, []).append(res)
    write_json_atomic(out_dir / "retrieval.json", retrieval)
    if ranks:
        write_ranks(out_dir / "retrieval_ranks.npz", ranks)
    extra = run_extra_evals(r, out_dir)
    return {"bench": bench_metrics, "retrieval_models": sorted(retrieval), "evals": extra}


def run_extra_evals(r: Recipe, out_dir: Path) -> dict:
    """I-HallA / VOPE / VIGIL: each eval's library function with its recipe section (the synthetic world wired
    in where a section says ``synthetic``), into ``<run_dir>/eval/NAME``."""
    from dataclasses import replace

    from halsift.launch.eval_command import run_eval

    done = {}
    for name, cfg in r.evals.enabled().items():
        target = out_dir / name
        if not (target / "metrics.json").exists():
            run_eval(name, replace(cfg, out=str(target)))
        done[name] = str(target)
    return done


def stage_report(r: Recipe, p: Paths) -> dict:
    from halsift.eval.report.compare import compare_filters_report
    from halsift.eval.metrics.retrieval import read_ranks

    rfile = p.stage("eval") / "retrieval.json"
    retrieval = json.loads(rfile.read_text()) if rfile.exists() else {}
    ranks_file = p.stage("eval") / "retrieval_ranks.npz"  # absent in runs from before it was written: no CIs
    ranks = read_ranks(ranks_file) if ranks_file.exists() else None
    bench_file = p.stage("eval") / "bench" / "metrics.json"
    bench = json.loads(bench_file.read_text()) if bench_file.exists() else {}
    selections = {}
    for name in _filters(r):
        mpath = p.named("select", name) / "manifest.json"
        selections[name] = json.loads(mpath.read_text()) if mpath.exists() else {}
    metrics = compare_filters_report(r.name, retrieval, bench, selections, list(_retrieval_sets(r, p)),
                                     p.stage("report"), wandb_mode=r.wandb.mode, wandb_project=r.wandb.project,
                                     filters=[n for n in _scored(r) if p.named("score", n).exists()],
                                     extra_reports={n: p.stage("eval") / n / "report.md" for n in r.evals.enabled()},
                                     bench_split=r.eval.bench_split, ranks=ranks, seed=r.seed,
                                     samples=report_samples(r, p))
    return {"metrics": metrics}


def report_samples(r: Recipe, p: Paths):
    """The report's sample browser: corpus and bench captions with every detector's sentence scores and what each
    filter's selection kept (:func:`halsift.eval.report.html.collect_samples`)."""
    from halsift.eval.report.html import collect_samples

    scored = [n for n in _scored(r) if p.named("score", n).exists()]
    corpus = {n: _scores_dir(p, n, "corpus") for n in scored if _scores_dir(p, n, "corpus").exists()}
    bench = {n: _scores_dir(p, n, "bench") for n in scored if _scores_dir(p, n, "bench").exists()}
    sels = {n: (p.named("select", n), r.select.resolved(n)[0]) for n in _filters(r)
            if (p.named("select", n) / "kept.parquet").exists()}
    return collect_samples(scored, corpus=p.corpus if corpus else None, corpus_scores=corpus, selections=sels,
                           bench=bench_subset(p.bench, r.eval.bench_split, p.run) if bench else None,
                           bench_scores=bench, keep=r.eval.keep)


STAGE_FUNCS = {s: globals()[f"stage_{s}"] for s in STAGES}  # recipe_config.STAGE_INPUTS names them


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
    stages = [s for s in r.stages if not (s == "world" and not r.world.enabled)]
    if ranks is not None and not ranks.is_main:
        recipe_ranks.follow(p.run, ranks, stages, {s: p.stage(s) for s in stages},
                            {s: inputs[s]["fingerprint"] for s in stages}, lambda: stage_score(r, p, ranks))
        return p.stage("report")
    p.run.mkdir(parents=True, exist_ok=True)
    write_json_atomic(p.run / "recipe.resolved.json", to_dict(r))
    import yaml

    (p.run / "recipe.resolved.yaml").write_text(yaml.safe_dump(to_dict(r), sort_keys=False))
    saved = {s: _done(p.stage(s)) for s in stages}
    current = [s for s in stages if saved[s] is not None and s not in force
               and saved[s].get("inputs", {}).get("fingerprint") == inputs[s]["fingerprint"]]
    if ranks is not None:  # the stages the other ranks need not wait for
        recipe_ranks.write_plan(p.run, ranks, current)
    for stage in stages:
        d = p.stage(stage)
        if stage in current:
            log.info("stage %s: complete, skipped", stage)
            print(f"[halsift run] {stage}: already complete, skipped")
            continue
        if saved[stage] is not None:
            print(f"[halsift run] {stage}: {_changed(saved[stage], inputs[stage])} since it ran; clearing {d} and "
                  "re-running")
            remove_tree(d)
        print(f"[halsift run] {stage}: running")
        started = time.time()
        try:
            with recipe_ranks.stage_scope(ranks, stage):  # rank 0: score with every rank, any other stage alone
                info = stage_score(r, p, ranks) if stage == "score" else STAGE_FUNCS[stage](r, p)
        except BaseException as e:
            if ranks is not None:
                recipe_ranks.write_failure(p.run, ranks, stage, e)
            raise
        _mark_done(d, {**info, **({"launch": ranks.launch} if ranks else {})}, started, inputs[stage])
        print(f"[halsift run] {stage}: done in {time.time() - started:.1f}s")
    return p.stage("report")
