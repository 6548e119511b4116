"""``halsift score --detector cascade:...``: the cascade as a staged job (issue 44).

Each stage is an ordinary score job (:class:`~halsift.filtering.scoring.job.ScoreJob`) into ``OUT/_stages/NAME``
on the engine the command names, so it resumes and splits into ranks, tasks or Ray actors like any score run:

1. ``cheap``: the cheap detector over every unit;
2. ``sample``: the judge (a ``subset`` detector: :class:`~halsift.filtering.detectors.cascade.SubsetDetector`) on the
   units of the uniform random sample (:func:`.cascade_plan.in_sample`, rate ``sample * budget``);
3. the plan (:mod:`.cascade_plan`: cut, band, map), fitted on the corpus and frozen in ``OUT/_cascade/plan.json``
   (a rerun reads it, never refits; a changed spec is refused);
4. ``band``: the judge on the band's units not in the sample;
5. the folder itself: one part per cheap part, each unit's standing score (the judge's where it was judged, else the
   mapped cheap score) and ``scored_by`` (``judge`` or ``cheap``); the manifest's ``cascade`` block says the judge
   share actually spent.

With ``plan=CORPUS_OUT`` (calibration units, e.g. a bench) stages 2-4 are one stage ``judged``: the judge on the
units of the frozen band or of the sample rule, nothing fitted. The whole is one pipeline job (:class:`CascadeJob`,
what :meth:`ScoreJob.staged` makes of a cascade spec), so ``halsift score``, ``halsift.score`` and a recipe run it
through the same door on any engine. Independent tasks (``--num-tasks``) each run every stage; a task that finishes
its share of a stage waits for the other tasks' share with its model loaded (the judge is loaded once per process for
the sample and the band alike).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from halsift.corpus.errors import InputError
from halsift.execution.engines import Engine, Summary
from halsift.execution.job import Pipeline, Place
from halsift.filtering.scoring.cascade_plan import Plan, caption_groups, fit_plan, sample_judge, unit_sample

ScoreJob = Any  # a :class:`~halsift.filtering.scoring.job.ScoreJob` (which makes a cascade spec this pipeline)

STAGES, PLAN_DIR, PLAN_FILE = "_stages", "_cascade", "plan.json"


class CascadeError(InputError):
    """A cascade that cannot run as asked (one line)."""


class CascadeMismatch(CascadeError):
    """A folder that holds another cascade (another spec, or fitted on other units): one line."""


def is_cascade(spec: Any) -> bool:
    """Whether a detector spec (string, file, mapping or detector) is a cascade; builds nothing."""
    from halsift.filtering.detectors.base import Detector
    from halsift.filtering.detectors.spec import iter_specs

    if isinstance(spec, Detector):
        return spec.family == "cascade"
    try:
        return iter_specs(spec)[0][1] == "cascade"
    except Exception:  # noqa: BLE001 - a bad spec is reported by the run that builds it
        return False


def _place(engine: Engine, job: ScoreJob) -> Place:
    """Where the cascade's own steps run: the launch's ranks on the local engine, a lone process on the others."""
    if engine.name == "local":
        from halsift.execution.ranks import rank_place

        return rank_place(job.device)
    return Place(device=job.device)


def _stage(job: ScoreJob, detector: Any, out: Path, engine: Engine, embeddings: str | None = None) -> Summary:
    """Run one stage as an ordinary score job on ``engine`` (through its door: a set-level cheap detector runs as
    its members then their combination); a task waits until the stage's folder is complete (keeping its model
    loaded)."""
    stage = dataclasses.replace(job, detector=detector, out=str(out), embeddings=embeddings, role="cascade stage",
                                root=str(Path(job.out).resolve()))
    return engine.execute(stage, wait=True)


def _units(folder: Path):
    from halsift.corpus.scores import read_scores

    t = read_scores(folder, ["key", "sentence_index", "score", "parsed"])
    return (t["key"].to_pylist(), t["sentence_index"].to_numpy().astype(np.int64),
            t["score"].to_numpy().astype(np.float64), t["parsed"].to_numpy(zero_copy_only=False))


def _write_keys(path: Path, keys: list[str], idx: np.ndarray, state) -> None:
    import pyarrow as pa

    from halsift.corpus.scores import write_part_atomic

    import pyarrow.parquet as pq

    table = pa.table({"key": pa.array(keys, pa.string()), "sentence_index": pa.array(idx, pa.int32())})
    # rewritten only when it changed: the subset detector's fingerprint covers the file, so an identical rewrite
    # would make the stage rescore every part
    if state.is_main_process and not (path.is_file() and pq.read_table(path).equals(table)):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_part_atomic(table, path)
    state.wait_for_everyone()


def _judged(folder: Path, keys_file: Path) -> dict[tuple[str, int], tuple[float, bool]]:
    """The judge's rows of a subset stage: only the units its key file lists (the rest are placeholders)."""
    import pyarrow.parquet as pq

    want = pq.read_table(keys_file)
    wanted = set(zip(want["key"].to_pylist(), want["sentence_index"].to_pylist()))
    k, i, s, p = _units(folder)
    return {(a, int(b)): (float(c), bool(d)) for a, b, c, d in zip(k, i, s, p) if (a, int(b)) in wanted}


def judge_members(judge: Any) -> tuple[list, list[float] | None, str]:
    """``(member specs, weights, norm)``: a set-level judge (an ensemble normalised over the scored set) is run
    member by member and combined with the sample's frozen statistics; any other judge is its own single member."""
    from halsift.filtering.detectors.spec import iter_specs

    _, family, opts = iter_specs(judge)[0]
    if family == "ensemble" and opts.get("norm", "none") != "none":
        members = list(opts["members"])
        weights = opts.get("weights")
        weights = [float(weights)] if isinstance(weights, (int, float)) else weights
        return members, None if weights is None else [float(w) for w in weights], opts["norm"]
    return [judge], None, "none"


def _judge_stage(job: ScoreJob, judge: Any, keys_file: Path, folder: Path, engine: Engine, loaded: dict
                 ) -> dict[tuple[str, int], tuple[np.ndarray, bool]]:
    """The judge on the units of ``keys_file`` (one subset stage per member of a set-level judge): per unit its
    member scores and whether every member parsed. ``loaded``: the judge members this process has loaded (by
    member index), so that the sample and the band share one loaded judge."""
    from halsift.filtering.detectors.spec import load_detector

    members, _, _ = judge_members(judge)
    per = []
    for i, m in enumerate(members):
        d = folder if len(members) == 1 else folder / f"m{i}"
        if i in loaded:
            subset = loaded[i].with_keys(str(keys_file))
        else:
            subset = loaded[i] = load_detector({"family": "subset", "detector": m, "keys": str(keys_file)})
        _stage(job, subset, d, engine)
        per.append(_judged(d, keys_file))
    return {u: (np.array([p[u][0] for p in per]), all(p[u][1] for p in per)) for u in per[0]}


def caption_labels(data: Any, keys: list[str], agg: str) -> list[str]:
    """Per unit, its caption for a caption-level cascade: its key in shards; in a bench (one key per sentence
    row) the row's ``caption_id``, so that calibration captions are sampled, banded and mapped whole, as corpus
    captions are. A sentence cascade keeps the keys."""
    from halsift.filtering.scoring.settings import is_bench

    if agg == "sentence" or not is_bench(data):
        return keys
    from halsift.corpus.bench import iter_bench

    caption_of = {row.id: row.caption_id for row in iter_bench(data)}
    return [caption_of.get(k, k) for k in keys]


def load_plan(where: str | Path, verify: bool = True) -> Plan:
    """The frozen plan of a cascade score folder (or its ``plan.json``), refused in one line naming the file when it
    is not the plan its folder recorded (:func:`plan_record`: altered, replaced or without a record) or not a plan
    at all; ``verify=False`` skips the record (the folder's own run, which refits a plan that fails it)."""
    p = Path(where)
    p = p / PLAN_DIR / PLAN_FILE if p.is_dir() else p
    if not p.is_file():
        raise CascadeError(f"plan={where}: no frozen cascade plan there (expected a cascade score folder, "
                           f"holding {PLAN_DIR}/{PLAN_FILE})")
    if verify and not plan_holds(p):
        raise CascadeError(f"{p}: not the plan its cascade folder recorded (altered since it was fitted, or no "
                           "record); rerun that cascade to refit it, or give another plan")
    try:
        return Plan.from_json(json.loads(p.read_text()))
    except (ValueError, KeyError, TypeError) as e:
        raise CascadeError(f"{p}: not a readable cascade plan ({type(e).__name__}: {str(e)[:200]}); rerun that "
                           "cascade to refit it") from None


def plan_holds(path: Path) -> bool:
    """Whether ``plan.json`` still has the content its folder recorded when it was fitted (:func:`plan_record`), and
    so has the student a ``learn=`` plan names."""
    from halsift.execution.run_folder import part_record, part_reusable

    rec = part_record(path.parent, path.name)
    if rec is None or not part_reusable(path.parent, path.name, {}):
        return False
    student = rec.get("student")
    return student is None or student == _student_content(path.parent)


def plan_record(pdir: Path) -> None:
    """Record the frozen plan (and a ``learn=`` plan's student) by content: what :func:`load_plan` verifies."""
    from halsift.execution.run_folder import part_done

    student = _student_content(pdir)
    part_done(pdir, PLAN_FILE, {"student": student} if student is not None else {})


def _student_content(pdir: Path) -> str | None:
    """One hash over the content of a ``learn=`` plan's student files (``None`` when there is none)."""
    import hashlib

    from halsift.execution.run_folder import content

    folder = pdir / "student"
    if not folder.is_dir():
        return None
    h = hashlib.blake2b(digest_size=16)
    for f in sorted(x for x in folder.rglob("*") if x.is_file()):
        h.update(f"{f.relative_to(folder).as_posix()}:{content(f)['hash']}".encode())
    return h.hexdigest()


def load_plan_dir(where: str | Path) -> Path:
    """The folder holding a frozen plan's files (``plan.json`` and a ``learn=`` head's student)."""
    p = Path(where)
    return p / PLAN_DIR if p.is_dir() else p.parent


def _refine(job: ScoreJob, engine: Engine, plan_dir: Path, learned: dict, embeddings: str | None, stages: Path,
            keys: list[str], idx: np.ndarray, cheap: np.ndarray) -> np.ndarray:
    """Stage ``learned``: the plan's head on every unit (from ``embeddings``, else encoded); the refined scores in
    the cheap stage's order."""
    from halsift.filtering.scoring.cascade_learn import refined, student_spec

    _stage(job, student_spec(plan_dir, learned, embeddings), stages / "learned", engine)
    lk, li, ls, _ = _units(stages / "learned")
    if lk != keys or not np.array_equal(li, idx):  # two score runs of one input: the same rows in the same order
        raise CascadeError(f"{stages / 'learned'}: its units differ from {stages / 'cheap'}'s; rerun the cascade "
                           "into a new --out")
    return refined(ls, cheap, learned)


@dataclasses.dataclass
class CascadeJob(Pipeline):
    """A cascade spec's score job as the staged pipeline of the module docstring."""

    job: ScoreJob
    kind = "score"

    def run_on(self, engine: Engine) -> Summary:
        return run_cascade(self.job, engine)


def before_spending(job: ScoreJob, det: Any, spec: str, out: Path, state: Place) -> None:
    """Everything that can refuse a cascade, checked before its first stage (no cheap pass, no judge call, nothing
    written but the folder's ``running`` record): the folder's identity (another cascade's folder, e.g. another
    ``seed``, is refused in one line), every file its specs name, the ``learn=`` vectors against the data, and the
    sample the budget gives (counted on the data's units without decoding an image: at most the units the cheap pass
    scores, so a sample too small here is too small there)."""
    from halsift.filtering.detectors.spec import missing_files
    from halsift.filtering.scoring.parts import check_or_start, plan_parts

    parts, inputs = plan_parts(job.data)
    out.mkdir(parents=True, exist_ok=True)
    check_or_start(out, {"detector": spec, "detector_name": spec, "unit": job.unit, "inputs": inputs}, state)
    for what, member in (("judge", det.judge_spec), ("cheap", det.cheap)):
        gone = missing_files(member)
        if gone:
            where, opt, path = gone[0]
            raise CascadeError(f"cascade {what}: {where or what} option {opt}={path} does not exist")
    shards = [Path(p.source) for p in parts if p.captions is None]
    if det.learn:
        from halsift.corpus.embedding_store import check_embedded_from

        if not (Path(det.learn) / "_manifest.json").is_file():
            raise CascadeError(f"cascade: learn={det.learn} is not a `halsift embed` folder (no _manifest.json); "
                               "embed the shards the cascade scores: halsift embed --data SHARDS --out EMB")
        check_embedded_from(det.learn, shards)
    if det.plan or (out / PLAN_DIR / PLAN_FILE).is_file():
        return  # a frozen plan draws no sample
    from halsift.corpus.images import SkipCounter
    from halsift.filtering.scoring.cascade_learn import MIN_UNITS
    from halsift.filtering.scoring.parts import iter_caption_groups

    keys, idx = [], []
    for p in parts:
        for items in iter_caption_groups(p, job.unit, SkipCounter(), decode=False):
            keys += [it.key for it in items]
            idx += [it.sentence_index for it in items]
    caps = caption_labels(job.data, keys, det.agg)
    drawn = int(unit_sample(caps, np.asarray(idx, np.int64), det.seed, det.sample * det.budget, det.agg).sum())
    need = MIN_UNITS if det.learn else 1
    if drawn < need:
        raise CascadeError(f"cascade: budget={det.budget:g} x sample={det.sample:g} draws {drawn} of the at most "
                           f"{len(keys)} units for the judge's sample (at least {need} needed"
                           + (" to fit learn='s head" if det.learn else "") + "): raise budget or sample"
                           + (", or drop learn=" if det.learn else ""))


def run_cascade(job: ScoreJob, engine: Engine) -> Summary:
    """Run the cascade of ``job.detector`` on ``engine`` as the staged job of the module docstring."""
    from halsift.corpus.shards import write_json_atomic
    from halsift.filtering.detectors.spec import load_detector

    det = load_detector(job.detector)
    spec = det.canonical()
    out = Path(job.out)
    stages, pdir = out / STAGES, out / PLAN_DIR
    state = _place(engine, job)
    _, weights, norm = judge_members(det.judge_spec)
    loaded: dict = {}  # the judge's members, loaded once in this process for every judged stage
    before_spending(job, det, spec, out, state)  # identity, files, sample size: refused before any stage runs

    _stage(job, det.cheap, stages / "cheap", engine, job.embeddings)
    keys, idx, cheap, _ = _units(stages / "cheap")
    agg = det.agg  # a frozen plan has it too: its spec, which holds agg, must equal this one
    caps = caption_labels(job.data, keys, agg)  # what a caption-level cascade groups and samples by
    rate = det.sample * det.budget
    if det.plan:  # calibration units through the corpus's frozen cascade
        plan = load_plan(det.plan)
        if plan.spec != spec:
            raise CascadeError(f"plan={det.plan}: fitted for {plan.spec!r}, not this cascade {spec!r}")
        if plan.learned:  # the corpus's head, each calibration unit encoded by the CLIP that made its vectors
            cheap = _refine(job, engine, load_plan_dir(det.plan), plan.learned, None, stages, keys, idx, cheap)
        sampled, band = plan.judged(caps, idx, cheap)
        judged_mask = sampled | band
        _write_keys(pdir / "judged.parquet", [k for k, m in zip(keys, judged_mask) if m], idx[judged_mask], state)
        raw = _judge_stage(job, det.judge_spec, pdir / "judged.parquet", stages / "judged", engine, loaded)
        band_mask = judged_mask & ~sampled
    else:
        sampled = unit_sample(caps, idx, det.seed, rate, agg)
        _write_keys(pdir / "sample.parquet", [k for k, m in zip(keys, sampled) if m], idx[sampled], state)
        raw = _judge_stage(job, det.judge_spec, pdir / "sample.parquet", stages / "sample", engine, loaded)
        plan_path = pdir / PLAN_FILE
        plan = None
        if plan_path.is_file() and plan_holds(plan_path):  # frozen: a rerun never refits a plan it recorded
            plan = load_plan(plan_path, verify=False)
            if plan.spec != spec or plan.units != len(keys):
                raise CascadeMismatch(f"{out}: holds a cascade fitted for {plan.spec!r} on {plan.units} units; this "
                                      f"run is {spec!r} on {len(keys)}: use a new --out")
            if plan.learned:
                cheap = _refine(job, engine, pdir, plan.learned, det.learn, stages, keys, idx, cheap)
        elif plan_path.is_file():  # altered, unreadable or unrecorded: fitted again from the stored sample
            print(f"cascade: {plan_path} is not the plan this folder fitted (altered since, unreadable or without a "
                  "record); fitting it again from the judged sample (no judge call)", flush=True)
        if plan is None:
            js = np.stack([raw[(k, int(i))][0] for k, i, m in zip(keys, idx, sampled) if m]) if sampled.any() \
                else np.empty((0, 1))
            fit_on, learned = cheap, None
            if det.learn:  # the sample's judge scores teach a head that refines the cheap score (cascade_learn)
                from halsift.filtering.scoring.cascade_learn import learn

                head, oof = learn(det.learn, keys, idx, caption_groups(caps)[0], sampled, cheap,
                                  sample_judge(js, norm, weights)[0], pdir)
                learned = head.to_json()
                state.wait_for_everyone()
                cheap = _refine(job, engine, pdir, learned, det.learn, stages, keys, idx, cheap)
                fit_on = cheap.copy()
                fit_on[sampled] = oof  # the sample's own predictions would look more like the judge than the rest
            try:
                plan = fit_plan(spec, fit_on, sampled, js, det.budget, det.keep, rate, det.seed, norm, weights,
                                keys=caps, agg=agg)
            except ValueError as e:
                raise CascadeError(str(e)) from None
            plan.learned = learned
            if state.is_main_process:
                pdir.mkdir(parents=True, exist_ok=True)
                write_json_atomic(plan_path, plan.to_json())
                plan_record(pdir)
            state.wait_for_everyone()
        band_mask = plan.in_band(plan.band_values(caps, cheap)) & ~sampled
        _write_keys(pdir / "band.parquet", [k for k, m in zip(keys, band_mask) if m], idx[band_mask], state)
        raw.update(_judge_stage(job, det.judge_spec, pdir / "band.parquet", stages / "band", engine, loaded))
    units = list(raw)
    combined = plan.judge_scores(np.stack([raw[u][0] for u in units])) if units else np.empty(0)
    scores = {u: (float(v), raw[u][1]) for u, v in zip(units, combined)}
    manifest = _combine(job, spec, plan, stages / "cheap", scores, int(sampled.sum()), int(band_mask.sum()),
                        det.plan, state, dict(zip(keys, caps)) if agg != "sentence" else None,
                        stages / "learned" if plan.learned else None)
    return Summary(engine.name, out, True, state.is_main, [cascade_line(manifest)] if manifest else [],
                   manifest or {})


def _combine(job: ScoreJob, spec: str, plan: Plan, cheap_dir: Path, judged: dict, sample_units: int,
             band_units: int, frozen_from: str | None, state, caption_of: dict | None = None,
             learned_dir: Path | None = None) -> dict | None:
    """Write the cascade's own parts (one per cheap part) and manifest; returns the manifest (main process)."""
    import pyarrow.parquet as pq

    from halsift.corpus.fingerprint import spec_fingerprint
    from halsift.corpus.percent import percent
    from halsift.corpus.scores import scores_table, write_part_atomic
    from halsift.filtering.scoring.part_records import PART_META_KEY
    from halsift.execution.run_folder import part_done
    from halsift.filtering.scoring.parts import MANIFEST, check_or_start, finish_manifest, part_footer

    out = Path(job.out)
    cheap_manifest = json.loads((cheap_dir / MANIFEST).read_text())
    ident = {"detector": spec, "detector_name": spec, "unit": job.unit, "inputs": cheap_manifest["inputs"]}
    check_or_start(out, ident, state)
    if not state.is_main_process:
        state.wait_for_everyone()
        return None
    t0 = time.perf_counter()
    from halsift.filtering.scoring.cascade_learn import refined

    parts = [SimpleNamespace(name=n) for n in cheap_manifest["part_files"]]
    by = {"judge": 0, "cheap": 0}
    for p in parts:
        t = pq.read_table(cheap_dir / p.name, columns=["key", "sentence_index", "score", "parsed", "captioner"])
        keys, idx = t["key"].to_pylist(), t["sentence_index"].to_pylist()
        # a caption's sentences are all in one part (a shard's sample, a bench part's caption groups)
        base = t["score"].to_numpy()
        if learned_dir is not None:  # learn=: the plan maps the refined score, not the cheap one
            lt = pq.read_table(learned_dir / p.name, columns=["key", "sentence_index", "score"])
            if lt["key"].to_pylist() != keys or lt["sentence_index"].to_pylist() != idx:
                raise CascadeError(f"{learned_dir / p.name}: its units differ from {cheap_dir / p.name}'s; rerun "
                                   "the cascade into a new --out")
            base = refined(lt["score"].to_numpy(), base, plan.learned)
        mapped = plan.standing([caption_of[k] for k in keys] if caption_of else keys, base)
        cheap_parsed = t["parsed"].to_pylist()
        score, parsed, who = [], [], []
        for j, (k, i) in enumerate(zip(keys, idx)):
            hit = judged.get((k, int(i)))
            score.append(hit[0] if hit else float(mapped[j]))
            parsed.append(hit[1] if hit else bool(cheap_parsed[j]))
            who.append("judge" if hit else "cheap")
        by["judge"] += who.count("judge")
        by["cheap"] += who.count("cheap")
        table = scores_table(keys, idx, score, parsed, spec, {"captioner": t["captioner"].to_pylist(),
                                                               "scored_by": who})
        stats = {**part_footer(cheap_dir / p.name), "parse_failures": parsed.count(False),
                 "detector_fp": spec_fingerprint(spec)}
        table = table.replace_schema_metadata({PART_META_KEY: json.dumps(stats).encode()})
        if not _same_part(out / p.name, table):  # a rerun with nothing changed rewrites nothing
            write_part_atomic(table, out / p.name)
            part_done(out, p.name, {})
    units = by["judge"] + by["cheap"]
    calls = sample_units + band_units
    block = {"plan": str(out / PLAN_DIR / PLAN_FILE) if not frozen_from else str(frozen_from),
             "frozen_from": frozen_from, "units": units, "judge_calls": calls,
             "judge_share": percent(calls / units, 4) if units else None, "budget": percent(plan.budget, 4),
             "keep": percent(plan.keep, 4), "sample_units": sample_units, "band_units": band_units,
             "band": list(plan.band) if plan.band else None, "cut": plan.cut, "scored_by": by,
             "learned": plan.learned,
             "stages": [str(d) for d in sorted((out / STAGES).iterdir())]}
    m = finish_manifest(out, ident, parts, time.perf_counter() - t0, units, 0, 1,
                        max_parse_failures=job.max_parse_failures, extra={"cascade": block})
    state.wait_for_everyone()
    return m


def _same_part(path: Path, table) -> bool:
    """Whether the part at ``path`` is the part ``table`` would be written as (its record's content hash equals the
    hash of the bytes the writer would give), so that it need not be written again."""
    import hashlib

    import pyarrow as pa
    import pyarrow.parquet as pq

    from halsift.execution.run_folder import part_record, part_reusable

    rec = part_record(path.parent, path.name)
    if rec is None or not part_reusable(path.parent, path.name, {}):
        return False
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return hashlib.blake2b(sink.getvalue().to_pybytes(), digest_size=16).hexdigest() == rec.get("hash")


def cascade_line(m: dict) -> str:
    c = m["cascade"]
    return (f"cascade: the judge scored {c['judge_calls']} of {c['units']} units ({c['judge_share']:g}%, budget "
            f"{c['budget']:g}%): {c['sample_units']} sampled, {c['band_units']} in the band"
            + (f" (frozen plan of {c['frozen_from']})" if c["frozen_from"] else "")
            + (f"; cheap score refined on the sample (Spearman with the judge {c['learned']['cheap_spearman']:.3f} "
               f"-> {c['learned']['learned_spearman']:.3f} out of fold)" if c.get("learned") else ""))


def with_plan(spec: Any, plan_dir: str | Path) -> Any:
    """A cascade spec (string, spec file or mapping) with ``plan=plan_dir``: the same cascade through a frozen plan."""
    import os

    from halsift.filtering.detectors.spec import _is_spec_file, _read_spec_file

    if isinstance(spec, dict):
        return {**spec, "plan": str(plan_dir)}
    text = os.fspath(spec)
    if _is_spec_file(text):
        return {**_read_spec_file(Path(text)), "plan": str(plan_dir)}
    return f"{text},plan={plan_dir}"

