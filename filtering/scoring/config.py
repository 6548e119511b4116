"""``halsift score``'s settings (:class:`ScoreConfig`): the command's flags, the recipe's ``score:`` section and the
:class:`~halsift.filtering.scoring.job.ScoreJob` an engine runs (its fields are this class's,
:func:`~halsift.filtering.scoring.job.job_of`) all come
from this one class; its engine flags are :class:`~halsift.execution.flags.EngineFlags`, declared once for every
command whose work is a job."""

from __future__ import annotations

from dataclasses import dataclass

from halsift.corpus.config import WandbFlag, field, wandb_mode_field, wandb_project_field
from halsift.corpus.units import Unit
from halsift.execution.flags import RUN_ONLY, EngineFlags
from halsift.filtering.scoring.settings import check_settings

# the command line's own settings: not carried by the job an engine runs
CLI_ONLY = ("no_progress", "engine", "wandb", "wandb_project")


@dataclass
class ScoreConfig(EngineFlags):
    """``halsift score``'s settings: one class for its flags, ``--describe``, docs/config.md, the recipe's ``score:``
    section (every field but those a recipe sets itself: ``launch/recipe_config.SCORE_SET``) and the job
    (:class:`~halsift.filtering.scoring.job.ScoreJob`). The fields in :data:`RUN_ONLY` change how a run goes, not
    what it scores: never compared when a folder is reused, left out of a recipe's fingerprint."""

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
    # logging: once the folder is complete (launch/run_wandb.py)
    wandb: WandbFlag | None = wandb_mode_field()
    wandb_project: str = wandb_project_field()

    def validate(self) -> None:
        check_settings(unit=self.unit, data=self.data, batch_size=self.batch_size,
                       decode_workers=self.decode_workers, max_parse_failures=self.max_parse_failures)


__all__ = ["CLI_ONLY", "RUN_ONLY", "ScoreConfig"]
