"""The recipe schema: one YAML drives synth -> pretrain -> score -> select -> fine-tune -> eval -> report.

Every field has a default here and a one-line meaning (``halsift run --describe`` prints them as YAML).
Paths in a recipe are relative to the current directory; ``{run_dir}`` and ``{base}`` (the base CLIP weights
the pretrain stage produced or ``model.pretrained``) are substituted in detector specs.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, make_dataclass
from typing import Any, ClassVar

from halsift.corpus.config import ConfigError, WandbMode, field, fields_of
from halsift.corpus.safe_paths import safe_component
from halsift.eval.registry import EVALS, recipe_sections
from halsift.filtering.curation.config import DedupConfig
from halsift.filtering.scoring.config import RUN_ONLY as SCORE_RUN_ONLY, ScoreConfig
from halsift.filtering.scoring.settings import check_settings
from halsift.filtering.selection.config import SelectConfig, amount, check_guarantee, check_selection
from halsift.eval.runs.bench import BenchEvalConfig
from halsift.synth.world_config import WorldSettings
from halsift.training.clip_config import ClipTrainConfig

# The stages in run order, by name: each is a module of launch/stages/ (its body and the recipe sections it reads),
# whose REGISTRY lists them in this order (tests/launch/test_recipe_stages.py checks the two agree). Declared here,
# below the stages, so that the recipe's settings never import the code that runs them.
STAGES = ("world", "pretrain", "detectors", "dedup", "score", "select", "finetune", "eval", "report")
TRAINED_KINDS = ("lora", "world_judge")
# the report's own rows (the base model, the whole corpus): no detector, ensemble or variant may take these names
RESERVED_NAMES = ("no-tune", "unfiltered")
EXTRA_EVALS = recipe_sections()  # the evaluations with a typed section in a recipe's `evals:`


@dataclass
class WorldCfg(WorldSettings):
    """The synthetic world the first stage generates (``halsift synth``'s settings; the seed is the recipe's)."""

    enabled: bool = field(True, help="generate the synthetic world into <run_dir>/world (data.* default to it)")

    def validate(self) -> None:
        super().validate()
        if self.images < 10:
            raise ValueError(f"images: must be >= 10 in a recipe, got {self.images}")


@dataclass
class DataCfg:
    corpus: str = field("", help="shards to filter (folder, glob or brace pattern); '' = the synthetic world's")
    bench: str = field("", help="annotated bench.jsonl for detector AUROC; '' = the synthetic world's")
    retrieval: dict[str, str] = field(default_factory=dict,
                                      help="retrieval sets name -> retrieval.jsonl (COCO, Flickr8k ...); "
                                           "empty = the synthetic world's")
    pretrain: str = field("", help="clean shards to pre-train the base CLIP on; '' = the world's (if pretrain runs)")
    zeroshot: dict[str, str] = field(default_factory=dict,
                                     help="zero-shot classification sets name -> CLIP_benchmark wds folder or "
                                          "ImageFolder (`halsift eval zeroshot --data`); empty = the world's tasks")
    compositional: str = field("", help="SugarCrepe folder (CATEGORY.json + images/, `halsift eval compositional`); "
                                        "'' = the world's")


@dataclass
class ModelCfg:
    arch: str = field("ViT-B-32", help="open_clip architecture (open_clip.list_models()); halsift-tiny: a built-in "
                                       "2-layer model for tests and CPU smoke runs")
    pretrained: str = field("", help="open_clip pretrained tag or weights path of the base model; '' = pre-train it")


# ClipTrainConfig fields a recipe sets itself (its data, run folders, model section, eval sets, wandb section, seed)
RECIPE_SET = ("data", "data_weights", "out", "model", "pretrained", "retrieval", "bench", "eval_batch_size",
              "wandb_project", "wandb_run", "wandb_mode", "seed", "resume")
ClipTrainSection = fields_of(ClipTrainConfig, "ClipTrainSection", RECIPE_SET,
                             "`train clip`'s settings a recipe's pretrain/finetune section takes (same defaults)")


@dataclass
class TrainCfg(ClipTrainSection):
    """A recipe's CLIP training section: ClipTrainConfig's fields (one definition, one help, one validation)."""

    bench_split: str = field("test", help="bench split for the model's own detection AUROC in the loop "
                                          "('' = all rows, 'none' = skip)")

    def validate(self) -> None:
        check_split("bench_split", self.bench_split)
        self.clip_train_config(data=["-"], out="-").validate()

    def clip_train_config(self, **recipe_set: Any) -> ClipTrainConfig:
        """The ``train clip`` config of this section, with the fields the recipe sets (:data:`RECIPE_SET`)."""
        return ClipTrainConfig(**{f.name: getattr(self, f.name) for f in fields(ClipTrainSection)}, **recipe_set)


@dataclass
class PretrainCfg(TrainCfg):
    enabled: bool = field(True, help="pre-train the base CLIP (skipped when model.pretrained is set)")


@dataclass
class FinetuneCfg(TrainCfg):
    seeds: list[int] = field(default_factory=lambda: [0], range="[0, inf)",
                             help="fine-tune each selection once per seed")
    no_tune: bool = field(True, help="also evaluate the base model without fine-tuning")
    unfiltered: bool = field(False, help="also fine-tune on the whole corpus (every sentence)")
    jobs: int = field(0, range="[0, inf)",
                      help="fine-tuning runs at once on a CPU device, each in its own process with one thread "
                           "(0: one per core; 1: one after another). On a GPU they always run one after another")

    def validate(self) -> None:
        super().validate()


@dataclass
class TrainedDetectorCfg:
    kind: str = field("lora", help="lora: `train detector` (peft LoRA) on `base` with the bench's train/val splits | "
                                   "world_judge: the synthetic world's tiny VLM judge (pre-trained, then LoRA-tuned)")
    base: str = field("", help="lora: the base detector spec ({arch}, {base}, {run_dir} substituted)")
    options: dict[str, Any] = field(default_factory=dict,
                                    help="lora: `train detector` fields (steps, lr, lora_r, ...); "
                                         "world_judge: WorldJudgeSettings fields")

    def validate(self) -> None:
        if self.kind not in TRAINED_KINDS:
            raise ValueError(f"kind: expected one of {TRAINED_KINDS}, got {self.kind!r}")
        if self.kind == "lora" and not self.base:
            raise ValueError("base: required for kind lora (e.g. clip:arch={arch},checkpoint={base})")
        fixed = sorted({"base", "bench", "out"} & set(self.options))
        if fixed:
            raise ValueError(f"options.{fixed[0]}: set by the recipe, not an option")


DedupSection = fields_of(DedupConfig, "DedupSection", ("data", "out", "embeddings", "no_progress", "num_tasks",
                                                       "task_index", "claim_timeout"),
                         "`halsift dedup`'s settings a recipe's dedup section takes (same names, defaults, help)")


@dataclass
class DedupCfg(DedupSection):
    """Decontamination before scoring: the corpus without leaks of the recipe's retrieval sets and bench, and
    without duplicates (docs/curation.md)."""

    enabled: bool = field(True, help="decontaminate and deduplicate the corpus before scoring (false: score and "
                                     "select the corpus as it is, e.g. Table F without decontamination)")


# ScoreConfig fields a recipe sets itself: the detectors (score.detectors), the data and output folders, the ranks
# (`halsift launch`, not independent tasks) and the wandb section; every other field is the recipe's score section
SCORE_SET = ("detector", "data", "out", "num_tasks", "task_index", "claim_timeout", "wandb", "wandb_project")
ScoreSection = fields_of(ScoreConfig, "ScoreSection", SCORE_SET,
                         "`halsift score`'s settings a recipe's score section takes (same names, defaults, help)")
# what a stage's fingerprint leaves out of its sections: settings that change how a stage runs, not what it makes
FINGERPRINT_OMITS = {"score": (*(n for n in SCORE_RUN_ONLY if n not in SCORE_SET), "jobs"),
                     "dedup": ("engine", "address", "workers", "decode_workers"),
                     "pretrain": ("cache_mb",), "finetune": ("cache_mb",)}
# settings added to a section after recipes were fingerprinted: left out of the fingerprint while at their default
# (a field absent from an old record compares equal only to its default), so existing run folders are not re-run
FINGERPRINT_SINCE = {"score": {"embeddings": None}}


@dataclass
class ScoreCfg(ScoreSection):
    detectors: dict[str, str] = field(
        default_factory=lambda: {"clip": "clip:arch={arch},checkpoint={base}", "random": "random:seed=0",
                                 "oracle": "oracle"},
        help="detector name -> spec (or YAML path); scored on the corpus and on the bench. A NAME (here, in "
             "ensembles, variants and detectors) becomes a folder: ASCII letters, digits, . _ - + @ =")
    ensembles: dict[str, list[str]] = field(default_factory=dict,
                                            help="ensemble name -> member detector names (mean of scores)")
    jobs: int = field(0, range="[0, inf)",
                      help="detectors (and members of a set-level ensemble) scored at once on a CPU device, each in "
                           "its own process with one thread (0: one per core; 1: one after another). One at a time "
                           "on a GPU, under `halsift launch`, on ray or with decode_workers")

    def validate(self) -> None:
        for where, names in (("score.detectors", self.detectors), ("score.ensembles", self.ensembles)):
            for name in names:
                check_name(where, name)
        try:
            check_settings(unit=self.unit, batch_size=self.batch_size, decode_workers=self.decode_workers,
                           max_parse_failures=self.max_parse_failures)
        except ValueError as e:
            raise ValueError(f"score.{e}") from None
        if self.engine == "tasks":
            raise ValueError("score.engine: tasks are independent processes (`halsift score --num-tasks`); a recipe "
                             "runs on `halsift launch` ranks (local) or on ray")
        if not self.detectors:
            raise ValueError("score.detectors: at least one detector is required")
        both = sorted(set(self.detectors) & set(self.ensembles))
        if both:
            raise ValueError(f"score.ensembles.{both[0]}: the name is already a detector (both would write "
                             f"score/{both[0]})")
        for name, members in self.ensembles.items():
            missing = [m for m in members if m not in self.detectors]
            if missing or len(members) < 2:
                raise ValueError(f"score.ensembles.{name}: needs >= 2 members from score.detectors; "
                                 f"unknown {missing}")


def check_name(where: str, name: str) -> None:
    """A recipe name that becomes a folder (``score/NAME``, ``select/NAME``, ``detectors/NAME`` ...): one safe path
    component (:func:`halsift.corpus.safe_paths.safe_component`), not a name the report keeps for itself."""
    safe_component(name, where)
    if name in RESERVED_NAMES:
        raise ValueError(f"{where}.{name}: the name is reserved for the report's own row; choose another")


def check_split(key: str, split: str) -> None:
    """A bench split (cut into ``<run_dir>/bench_SPLIT``): '' (all rows), 'none' or a safe folder name."""
    if split not in ("", "none"):
        safe_component(split, key, is_key=False)


@dataclass
class SelectVariantCfg:
    filter: str = field("", help="the detector or ensemble (a key of score.detectors / score.ensembles) whose "
                                 "scores this selection reads")
    keep: float = field(0.0, range="[0, 1]", help="fraction kept (0 = select.keep)")
    top_k: int = field(0, range="[0, inf)", help="number of units kept instead of a fraction (0 = as select)")
    threshold: float | None = field(None, range="[0, 100]",
                                    help="keep units scoring at least this, 0-100 (null = as select)")
    unit: str = field("", help="sentence | caption ('' = select.unit)")
    agg: str = field("", help="min | mean | prob | prune | repair ('' = select.agg)")

    def sets_amount(self) -> bool:
        """Whether this variant chooses how much to keep itself (else select's keep/top_k/threshold apply)."""
        return bool(self.keep or self.top_k or self.threshold is not None)


# SelectConfig fields a recipe sets itself (inputs and outputs per filter) or that only the command has (its engines,
# baseline, page and wandb flags): the rest is the recipe's select section, with the command's names and defaults
SELECT_SET = ("scores", "data", "out", "random", "seed", "export_keys", "detector", "allow_partial", "maxcount",
              "no_progress", "html", "keys_only", "num_tasks", "task_index", "wandb", "wandb_project")
SelectSection = fields_of(SelectConfig, "SelectSection", SELECT_SET,
                          "`halsift select`'s settings a recipe's select section takes (same names and defaults)")


@dataclass
class SelectCfg(SelectSection):
    """A recipe's select section: SelectConfig's fields (one definition, one default, one validation) + variants."""

    RENAMED: ClassVar[dict[str, str]] = {"default_captioner": "captioner", "default_source": "source"}

    variants: dict[str, SelectVariantCfg] = field(
        default_factory=dict, help="extra selections, each fine-tuned, evaluated and reported like a filter: "
                                   "name -> {filter, keep, top_k, threshold, unit, agg} (a keep-fraction sweep, "
                                   "whole captions vs pruned captions vs sentences)")

    def validate(self) -> None:
        check_selection("select", self.unit, self.agg, self.top_k, self.threshold)
        check_guarantee("select", self.max_hallucination, self.confidence, self.calibration, self.top_k,
                        self.threshold, "min", self.per_captioner, calibration_default=True,
                        composed=bool(self.where or self.rank), keep=self.keep)
        for name in self.variants:
            check_name("select.variants", name)
        if self.resumable or self.memory_limit:  # out of core: what the command's resumable engine cannot honour
            from halsift.filtering.selection.out_of_core import supported

            for where, unit, agg in (("select", self.unit, self.agg),
                                     *((f"select.variants.{n}", v.unit or self.unit, v.agg or self.agg)
                                       for n, v in self.variants.items())):  # as resolved() runs them
                why = supported(unit, agg, self.per_captioner)
                if why:
                    raise ValueError(f"{where}: select.resumable (out of core) is not for {why}; drop "
                                     "select.resumable/memory_limit")
        for name, v in self.variants.items():
            check_selection(f"select.variants.{name}", v.unit or self.unit, v.agg or self.agg, v.top_k, v.threshold)
            if not v.filter:
                raise ValueError(f"select.variants.{name}.filter: required (a key of score.detectors or "
                                 "score.ensembles)")
            if self.max_hallucination is not None and v.sets_amount() and (v.agg or self.agg) != "repair":
                given = "top_k" if v.top_k else "threshold" if v.threshold is not None else "keep"
                raise ValueError(f"select.variants.{name}.{given}: select.max_hallucination chooses how much every "
                                 "selection keeps (its certified threshold); drop it, or give the variant agg: "
                                 "repair (which keeps its amount)")

    def resolved(self, name: str) -> tuple[str, dict]:
        """``(filter, select() keyword arguments: keep, top_k, threshold, unit, agg)`` of selection ``name``: a
        variant, or a filter with the section's settings."""
        v = self.variants.get(name)
        if v is None:
            return name, {**amount(self.keep, self.top_k, self.threshold), "unit": self.unit, "agg": self.agg}
        how_much = amount(v.keep or self.keep, v.top_k, v.threshold) if v.sets_amount() else \
            amount(self.keep, self.top_k, self.threshold)
        return v.filter, {**how_much, "unit": v.unit or self.unit, "agg": v.agg or self.agg}


# BenchEvalConfig fields a recipe sets itself (its bench and score folders, eval/ folder, detectors' ensembles,
# seed) or leaves to other stages (the report's index.html; the likelihood analysis runs as `halsift eval bench`)
EVAL_SET = ("bench", "scores", "detector", "out", "ensemble", "seed", "html", "likelihood", "likelihood_images")
EvalBenchSection = fields_of(BenchEvalConfig, "EvalBenchSection", EVAL_SET,
                             "`eval bench`'s settings a recipe's eval section takes (same defaults)")


@dataclass
class EvalCfg(EvalBenchSection):
    """A recipe's eval section: `eval bench`'s settings (one definition, one check), and the recipe's own."""

    bench_split: str = field("", help="evaluate detectors on this bench split only ('' = all rows)")
    batch_size: int = field(128, range="[1, inf)", help="evaluation batch size")
    zeroshot: bool = field(True, help="zero-shot classification of every model (data.zeroshot or the world's tasks)")
    compositional: bool = field(True, help="compositional hard negatives (SugarCrepe) of every model "
                                           "(data.compositional or the world's)")

    def validate(self) -> None:
        check_split("bench_split", self.bench_split)
        self.bench_config(bench="-", scores=["-"]).validate()

    def bench_config(self, **recipe_set: Any) -> BenchEvalConfig:
        """The ``eval bench`` settings of this section, with the fields the recipe sets (:data:`EVAL_SET`)."""
        return BenchEvalConfig(**{f.name: getattr(self, f.name) for f in fields(EvalBenchSection)}, **recipe_set)


# one optional section per evaluation of the registry that has one (EvalEntry.section: its help), in its order
EvalsSections = make_dataclass("EvalsSections", [
    (name, EVALS[name].config | None, field(None, help=EVALS[name].section)) for name in EXTRA_EVALS],
    namespace={"__module__": __name__})


@dataclass
class EvalsCfg(EvalsSections):
    """The extra evaluations of the eval stage: each a typed section of its ``halsift eval NAME`` settings (the
    command's flags as keys, e.g. ``ihalla: {synthetic: true, prompts: 30}``); absent = not run. Its ``out`` is
    the recipe's: ``<run_dir>/eval/NAME``."""

    def enabled(self) -> dict[str, Any]:
        """The sections given, by eval name, in :data:`EXTRA_EVALS` order."""
        return {name: getattr(self, name) for name in EXTRA_EVALS if getattr(self, name) is not None}

    def validate(self) -> None:
        for name, cfg in self.enabled().items():
            if cfg.out:
                raise ValueError(f"{name}.out: set by the recipe (<run_dir>/eval/{name}), not a setting")


@dataclass
class WandbCfg:
    mode: WandbMode = field("offline", help="offline | online | disabled")
    project: str = field("halsift", help="wandb project")


@dataclass
class Recipe:
    name: str = field("quickstart", help="recipe name (report title)")
    run_dir: str = field("runs/quickstart", help="one folder for everything this recipe writes")
    seed: int = field(0, range="[0, inf)", help="seed for the world, random detectors, selection and training")
    device: str = field("auto", help="auto | cpu | cuda")
    stages: list[str] = field(default_factory=lambda: list(STAGES), help=f"stages to run, in order: {STAGES}")
    world: WorldCfg = field(default_factory=WorldCfg, help="the embedded synthetic world")
    data: DataCfg = field(default_factory=DataCfg, help="user data (overrides the world)")
    model: ModelCfg = field(default_factory=ModelCfg, help="the CLIP architecture and base weights")
    pretrain: PretrainCfg = field(default_factory=PretrainCfg, help="pre-training of the base CLIP")
    detectors: dict[str, TrainedDetectorCfg] = field(
        default_factory=dict, help="detectors trained before scoring, into <run_dir>/detectors/NAME; a score spec "
                                   "names one as {trained.NAME}")
    detector_jobs: int = field(0, range="[0, inf)",
                               help="detectors trained at once, each in its own process (0: one per GPU with 2 "
                                    "or more GPUs, one at a time on one GPU, on CPU one per 4 cores; 1: one "
                                    "after another)")
    dedup: DedupCfg = field(default_factory=DedupCfg, help="decontamination and dedup of the corpus (against the "
                                                            "retrieval sets and bench) before scoring")
    score: ScoreCfg = field(default_factory=ScoreCfg, help="detectors scored on the corpus and the bench")
    select: SelectCfg = field(default_factory=SelectCfg, help="top-k selection per detector")
    finetune: FinetuneCfg = field(default_factory=FinetuneCfg, help="CLIP fine-tuning on each selection")
    eval: EvalCfg = field(default_factory=EvalCfg, help="benchmark and retrieval evaluation")
    wandb: WandbCfg = field(default_factory=WandbCfg, help="logging")
    evals: EvalsCfg = field(default_factory=EvalsCfg,
                            help=f"extra evaluations run in the eval stage ({', '.join(EXTRA_EVALS)}), each with its "
                                 "`halsift eval NAME` settings; output in <run_dir>/eval/NAME")

    def validate(self) -> None:
        for name in self.detectors:
            check_name("detectors", name)
        bad = [s for s in self.stages if s not in STAGES]
        if bad:
            raise ConfigError(f"stages: unknown stage {bad[0]!r}; expected some of {STAGES}")
        if self.detectors and "detectors" not in self.stages:
            raise ConfigError(f"stages: 'detectors' is needed to train {sorted(self.detectors)}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"device: expected auto, cpu or cuda, got {self.device!r}")
        if not self.world.enabled:
            needs = {"corpus": "select" in self.stages or "finetune" in self.stages,
                     "bench": "score" in self.stages and not self.data.retrieval}
            for key, needed in needs.items():
                if needed and not getattr(self.data, key):
                    raise ConfigError(f"data.{key}: required when world.enabled is false (stages {self.stages})")
            if "finetune" in self.stages and not self.data.retrieval:
                raise ConfigError("data.retrieval: at least one retrieval set is required to compare fine-tuned "
                                  "models when world.enabled is false")
            if not self.model.pretrained and ("pretrain" in self.stages or "finetune" in self.stages) \
                    and not self.data.pretrain:
                raise ConfigError("model.pretrained: set base weights, or data.pretrain to pre-train on")
        scored = set(self.score.detectors) | set(self.score.ensembles)
        for name, v in self.select.variants.items():
            if name in scored:
                raise ConfigError(f"select.variants.{name}: the name is already a detector or ensemble")
            if v.filter not in scored:
                raise ConfigError(f"select.variants.{name}.filter: {v.filter!r} is not a key of score.detectors "
                                  f"or score.ensembles (known: {sorted(scored)})")
        judges = [n for n, d in self.detectors.items() if d.kind == "world_judge"]
        if judges and not self.world.enabled:
            raise ConfigError(f"detectors.{judges[0]}: kind world_judge needs the synthetic world (world.enabled)")
