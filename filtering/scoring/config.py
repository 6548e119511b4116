"""``halsift score``'s settings (:class:`ScoreConfig`): the command's flags, the recipe's ``score:`` section and the
:class:`~halsift.filtering.scoring.engine.ScoreJob` an engine runs (:func:`job_of`) all come from this one class."""

from __future__ import annotations

from dataclasses import dataclass

from halsift.corpus.config import WandbFlag, field, wandb_mode_field, wandb_project_field
from halsift.corpus.units import Unit
from halsift.filtering.scoring.engine import EngineName, ScoreJob
from halsift.filtering.scoring.settings import check_settings

_G = {"group": "scale-out (independent tasks, SLURM arrays, Ray)"}
# settings that change how a run goes, not what it scores: never part of a recipe's fingerprint (changing them never
# rescores), recorded in the score manifest (``run_settings``)
RUN_ONLY = ("device", "no_progress", "decode_workers", "full_hash", "engine", "address", "workers", "num_tasks",
            "task_index", "claim_timeout", "wandb", "wandb_project")


@dataclass
class ScoreConfig:
    """``halsift score``'s settings: one class for its flags, ``--describe``, docs/config.md and the recipe's
    ``score:`` section (every field but those a recipe sets itself: ``launch/recipe_config.SCORE_SET``). The
    fields in :data:`RUN_ONLY` change how a run goes, not what it scores: a recipe's fingerprint leaves them out."""

    detector: str = field("", help="detector spec or YAML file, e.g. clip:arch=ViT-B-32,pretrained=openai | "
                                   "random:seed=0 | oracle (`halsift score --describe`: the families' options)",
                          cli={"required": True, "metavar": "SPEC"})
    data: str = field("", help="shard folder / glob / brace pattern, or a bench.jsonl", cli={"required": True})
    out: str = field("", help="output folder: parquet parts + _manifest.json", cli={"required": True})
    unit: Unit = field("sentence", help="score each sentence against its image (default) "
                                                                  "or the whole caption")
    batch_size: int = field(64, range="[1, inf)", help="items per detector call")
    device: str | None = field(None, help="cpu, cuda, cuda:1 ... (default: the process's accelerate device)")
    no_progress: bool = field(False, help="no progress bar")
    decode_workers: int = field(0, help="read, decode and preprocess in N processes per rank (detectors with a CPU "
                                        "half, e.g. clip); 0: one read-ahead thread (default). Use the cores per "
                                        "rank minus one: the model's process needs a core of its own. Honoured "
                                        "by every --engine; torch then runs on the cores left (unless "
                                        "OMP_NUM_THREADS is set)",
                                cli={"metavar": "N"})
    embeddings: str | None = field(None, help="a folder written by `halsift embed`: every CLIP-family detector of "
                                              "--detector reads its image and text vectors from it instead of "
                                              "encoding (the same model, else exit 2)", cli={"metavar": "DIR"})
    full_hash: bool = field(False, help="fingerprint input shards by their whole content (default: sampled blocks, "
                                        "cheap for multi-GB shards): a rescore then also sees a change outside the "
                                        "sampled blocks that kept size and mtime")
    max_parse_failures: float = field(0.2, range="[0, 1]",
                                      help="stop (exit 2) when more than this share of the scored items got no "
                                           "parsable answer (a judge's reply, scored 50): checked after 200 "
                                           "items and at the end; 1 turns the check off",
                                      cli={"metavar": "FRACTION"})
    # scale-out: the task / Ray engines that replace the rank-split run
    num_tasks: int | None = field(None, help="run as one of N independent tasks sharing --out (default: "
                                             "$SLURM_ARRAY_TASK_COUNT in an array job); the last task to finish "
                                             "writes the complete manifest", cli={**_G, "metavar": "N"})
    task_index: int | None = field(None, help="this task's index, 0..N-1 (default: $SLURM_ARRAY_TASK_ID - "
                                              "$SLURM_ARRAY_TASK_MIN)", cli={**_G, "metavar": "I"})
    claim_timeout: float | None = field(None, help="take over a part whose claim has had no heartbeat for S seconds "
                                                   "(a dead node; default 600)", cli={**_G, "metavar": "S"})
    engine: EngineName = field("local", help="local: this process, or every rank under `halsift launch` (tasks when "
                                             "--num-tasks or a SLURM array task's environment is given); tasks: one "
                                             "of --num-tasks independent tasks; ray: score the parts on a Ray "
                                             "cluster, one actor per GPU, parts dealt as actors free up (pip install "
                                             "'halsift[ray]')", cli=_G)
    address: str | None = field(None, help="--engine ray: the cluster to join, e.g. auto or ray://head:10001 "
                                           "(default: a local one)", cli=_G)
    workers: int | None = field(None, help="--engine ray: number of scoring actors (default: one per GPU of the "
                                           "cluster, else per CPU)", cli=_G)
    # logging: once the folder is complete (launch/run_wandb.py)
    wandb: WandbFlag | None = wandb_mode_field()
    wandb_project: str = wandb_project_field()

    def validate(self) -> None:
        check_settings(unit=self.unit, data=self.data, batch_size=self.batch_size,
                       decode_workers=self.decode_workers, max_parse_failures=self.max_parse_failures)


def job_of(cfg, **given) -> ScoreJob:
    """The engine's job from ``cfg`` (a :class:`ScoreConfig`, or a recipe's ``score:`` section: the same names),
    with ``given`` (what a recipe sets itself: detector, data, out) over it; library code never sees argv."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(ScoreJob)}
    values = {n: getattr(cfg, n) for n in names if hasattr(cfg, n)}
    values["show_progress"] = not getattr(cfg, "no_progress", False)
    return ScoreJob(**{**values, **given})


__all__ = ["RUN_ONLY", "ScoreConfig", "job_of"]
