"""The score stage: every detector on the corpus and the bench, then the ensembles."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from halsift.corpus.config import ConfigError
from halsift.corpus.shards import write_json_atomic
from halsift.launch.stages.base import Paths, Stage
from halsift.launch.stages.detectors import substitute, trained_spec
from halsift.launch.score_processes import run_score_job, score_at_once, score_processes
from halsift.launch.stages.shared import bench_subset, log_stage, run_device

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe


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


def detector_specs(r: Recipe, p: Paths) -> dict[str, str]:
    """Detector name -> spec with ``{run_dir}``, ``{base}``, ``{arch}`` and ``{trained.NAME}`` substituted."""
    subs = {"run_dir": str(p.run), "base": p.base, "arch": r.model.arch}
    trained = {name: trained_spec(r, p, name) for name in r.detectors}
    return {name: substitute(spec, f"score.detectors.{name}", {**subs, "trained": _Trained(trained,
                                                                 f"score.detectors.{name}")})
            for name, spec in r.score.detectors.items()}


def scores_dir(p: Paths, name: str, what: str) -> Path:
    """``<run>/score/NAME/corpus`` or ``.../bench``: the score folder of a detector or ensemble."""
    return p.named("score", name) / what


def stage_score(r: Recipe, p: Paths, ranks=None) -> dict:
    """Score the corpus and the bench with every detector; under ``halsift launch`` on every rank (``ranks``: see
    :mod:`halsift.launch.recipe_ranks`), each scoring its share of the parts; the ensembles on rank 0."""
    from halsift.filtering.detectors.spec import load_detector
    from halsift.filtering.scoring.cascade import is_cascade
    from halsift.filtering.scoring.set_level import SetLevelJob
    from halsift.launch.recipe_ranks import main_process_first

    info = {}
    with main_process_first(ranks):  # rank 0 cuts the bench subset, the others then read it
        bench = bench_subset(p.bench, r.eval.bench_split, p.run)  # only the rows the eval stage reads
        calibration = bench_subset(p.bench, calibration_splits(r), p.run) if needs_calibration(r, p) else ""
    specs = detector_specs(r, p)
    made: set[str] = set()  # score folders the stage's processes completed (none outside score_processes)
    processes = score_processes(r, ranks, run_device(r))
    if processes > 1:  # the detectors (an ensemble's members) at once, each in its own process; the pass below
        # scores what they left (random, oracle, cascades) and combines the set-level ensembles
        made = score_at_once({n: score_jobs(r, p, n, s, bench, calibration) for n, s in specs.items()
                              if not is_cascade(s)}, processes, p.run)
    for name, spec in specs.items():
        if is_cascade(spec):  # staged: the cheap pass, the judged sample and band, then bench/calibration through its plan
            info[name] = _score_cascade(r, p, name, spec, bench, calibration)
            continue
        detector = None  # loaded once for its corpus, bench and calibration jobs, when one is left to run
        for job in score_jobs(r, p, name, spec, bench, calibration):
            if str(job.out) in made:
                continue
            if not job.embeddings:
                detector = detector or load_detector(spec)
                job = dataclasses.replace(job, detector=detector)
            staged = job.staged()
            run_score_job(dataclasses.replace(staged, made=frozenset(made)) if isinstance(staged, SetLevelJob)
                          else job, r.score.engine)
        info[name] = spec
        del detector
    if ranks is not None and not ranks.is_main:
        return {"detectors": info}
    for name, members in r.score.ensembles.items():
        for what in ("corpus", "bench", "calibration"):
            if not all(scores_dir(p, m, what).exists() for m in members):
                continue
            write_ensemble(name, [scores_dir(p, m, what) for m in members], scores_dir(p, name, what))
        info[name] = "mean(" + ", ".join(members) + ")"
    log_stage(r, p, "score", {n: scores_dir(p, n, "corpus") for n in info})
    return {"detectors": info}


def score_jobs(r: Recipe, p: Paths, name: str, spec: str, bench: str | Path, calibration: str | Path) -> list:
    """Detector NAME's score jobs (:class:`~halsift.filtering.scoring.job.ScoreJob`, ``detector``: its spec): the
    corpus (when the recipe selects from it), the bench and the calibration set (guaranteed selection,
    stages/select.py), these two per sentence, their rows. Stored embeddings (of the corpus's shards) apply to the
    corpus alone, and only to a detector with a CLIP-family member (a judge scores as it would without them): such
    a job keeps ``embeddings`` set, the others have none."""
    from halsift.filtering.detectors.embeddings_spec import reads_embeddings
    from halsift.filtering.scoring.job import job_of

    jobs = []
    if p.corpus and "select" in r.stages:
        stored = bool(r.score.embeddings) and reads_embeddings(spec)
        jobs.append(job_of(r.score, detector=spec, data=p.corpus, out=scores_dir(p, name, "corpus"),
                           **({} if stored else {"embeddings": None})))
    for what, data in (("bench", bench), ("calibration", calibration)):
        if data:
            jobs.append(job_of(r.score, detector=spec, data=data, out=scores_dir(p, name, what), unit="sentence",
                               embeddings=None))
    return jobs


def run_score(r: Recipe, detector, data, out: Path, **given) -> None:
    """One score job of the recipe: ``halsift score``'s settings from its ``score:`` section
    (:func:`~halsift.filtering.scoring.job.job_of`) with ``given`` over them (:func:`run_score_job`)."""
    from halsift.filtering.scoring.job import job_of

    run_score_job(job_of(r.score, detector=detector, data=data, out=out, **given), r.score.engine)


def _score_cascade(r: Recipe, p: Paths, name: str, spec: str, bench: str | Path, calibration: str | Path) -> str:
    """A cascade (issue 44): fitted on the corpus, then the bench and the calibration rows through its frozen
    plan (:mod:`halsift.filtering.scoring.cascade`); each an ordinary score job of the recipe."""
    from halsift.filtering.scoring.cascade import with_plan

    corpus = scores_dir(p, name, "corpus")
    if not (p.corpus and "select" in r.stages):
        raise ConfigError(f"score.detectors.{name}: a cascade is fitted on the corpus; it needs data.corpus and "
                          "the select stage")
    from halsift.filtering.detectors.embeddings_spec import reads_embeddings

    run_score(r, spec, p.corpus, corpus, **({} if r.score.embeddings and reads_embeddings(spec) else
                                            {"embeddings": None}))
    for data, what in ((bench, "bench"), (calibration, "calibration")):
        if data:
            run_score(r, with_plan(spec, corpus), data, scores_dir(p, name, what), unit="sentence", embeddings=None)
    return spec


def check_cascade_aim(r: Recipe, name: str, spec) -> None:
    """A cascade judges around one cut: its ``keep`` (the share kept) of its units (``agg``: sentences, or whole
    captions by their mean/min). Every selection the recipe makes from its scores (select's own, and each
    ``select.variants`` entry whose filter is this detector) must keep that share of those units: one line naming
    the key otherwise (its judge budget would be spent around another cut). Not checked: the amount of a guaranteed
    selection (``select.max_hallucination`` certifies its own threshold; ``keep`` is then the user's estimate of
    it); refused: a ``top_k`` or ``threshold`` selection (a cut the cascade cannot aim at before the corpus is
    scored). With ``score.unit: caption`` the units are whole captions already, so any ``agg`` aims at them. Called
    when the recipe is checked (:func:`halsift.launch.recipe.check`), before any stage runs."""
    import dataclasses

    from halsift.filtering.detectors.spec import family_config, iter_specs

    defaults = {f.name: f.default for f in dataclasses.fields(family_config("cascade"))}
    opts = {**defaults, **iter_specs(spec)[0][2]}
    aim_agg, aim_keep = str(opts["agg"]), float(opts["keep"])
    selections = {"select": r.select.resolved(name)[1]}
    selections.update({f"select.variants.{v}": r.select.resolved(v)[1] for v, cfg in r.select.variants.items()
                       if cfg.filter == name})
    for key, how in selections.items():
        unit, agg = how["unit"], how["agg"]
        where = f"score.detectors.{name}" if key == "select" else key
        whose = "select keeps" if key == "select" else f"{key} keeps, from score.detectors.{name},"
        settings = f"select.unit={unit}, select.agg={agg}" if key == "select" else f"{key}: unit {unit}, agg {agg}"
        want = None if r.score.unit == "caption" else "sentence" if unit == "sentence" or agg in ("prune", "repair") \
            else agg if agg in ("mean", "min") else None
        if want is not None and aim_agg != want:
            raise ConfigError(f"{where}: the cascade is aimed at agg={aim_agg}, but {whose} "
                              + ("sentences" if want == "sentence" else f"whole captions by their {want} sentence score")
                              + f" ({settings}): give it agg={want}"
                              + ("" if key == "select" else " (a cascade aims at one cut: score another cascade for "
                                                            "this selection)"))
        if r.select.max_hallucination is not None and agg != "repair":
            continue  # the guarantee certifies its own cut
        if how["top_k"] or how["threshold"] is not None:
            given = "top_k" if how["top_k"] else "threshold"
            raise ConfigError(f"{where}: the cascade judges around a kept share (keep={aim_keep:g}), but "
                              f"{key if key != 'select' else 'select'}.{given} keeps a count or a score: give "
                              f"{'select' if key == 'select' else key}.keep={aim_keep:g} instead")
        if abs(how["keep"] - aim_keep) > 1e-9:
            fix = f"give it keep={how['keep']:g}" if key == "select" else \
                f"a cascade aims at one cut: score another cascade with keep={how['keep']:g} for this selection"
            raise ConfigError(f"{where}: the cascade judges around keep={aim_keep:g}, but {whose} {how['keep']:g} "
                              f"of the units: {fix}")


def write_ensemble(name: str, member_dirs: list[Path], out: Path) -> None:
    """Mean of member scores (:func:`halsift.filtering.detectors.ensemble.combine`, equal weights, no normalisation) per
    (key, sentence_index) all members scored, written as a score folder (seeds' Table 6 ensembles), with the first
    member's other columns (e.g. ``captioner``). Made again only when a member's parts changed (the members' part
    records are its own record)."""
    from halsift.corpus.scores import read_scores_df, scores_table, write_part_atomic
    from halsift.execution.run_folder import read_record
    from halsift.filtering.detectors.ensemble import combine

    made_from = [(read_record(d / "_manifest.json") or {}).get("part_records") for d in member_dirs]
    old = read_record(out / "_manifest.json") if (out / "part-ensemble.parquet").is_file() else None
    if old is not None and old.get("status") == "complete" and old.get("member_records") == made_from:
        return

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
    # the first member's other columns (the sample's captioner, ...): what select and the guarantee read beside scores
    first = read_scores_df(member_dirs[0])
    extra = [c for c in first.columns if c not in ("key", "sentence_index", "score", "parsed", "detector")]
    if extra:
        merged = merged.merge(first[["key", "sentence_index", *extra]], on=["key", "sentence_index"], how="left")
    table = scores_table(merged["key"], merged["sentence_index"], scores, parsed, name,
                         extra={c: merged[c].tolist() for c in extra})
    write_part_atomic(table, out / "part-ensemble.parquet")
    write_json_atomic(out / "_manifest.json", {"detector": name, "detector_name": name, "status": "complete",
                                               "part_files": ["part-ensemble.parquet"],
                                               "members": [str(d) for d in member_dirs],
                                               "member_records": made_from,
                                               "rows": int(len(merged)), "complete": True})


def calibration_splits(r: Recipe) -> str:
    """The bench splits a guaranteed selection calibrates on by default: train and val, never the evaluated one."""
    return ",".join(s for s in ("train", "val") if s != r.eval.bench_split)


def needs_calibration(r: Recipe, p: Paths) -> bool:
    """Whether to score the whole bench for a guaranteed selection's calibration (launch/stages/select.py): a
    bench, a select stage, no user-given calibration set, and an evaluated split (else the bench folder already
    holds every row)."""
    return bool(p.bench) and "select" in r.stages and not r.select.calibration and bool(r.eval.bench_split)


def scored_names(r: Recipe) -> list[str]:
    """Detectors and ensembles: the names with score folders."""
    return list(r.score.detectors) + list(r.score.ensembles)


STAGE = Stage("score", ("score", "eval.bench_split"), stage_score, every_rank=True)
