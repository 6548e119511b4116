"""The engine flags of every command whose work is a job (``score``, ``embed``, ``basic``, ``dedup``, ``select``'s
tasks), declared once: each command's settings class inherits :class:`EngineFlags`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from halsift.corpus.config import field

GROUP = {"group": "scale-out (independent tasks, SLURM arrays, Ray)"}
EngineName = Literal["local", "tasks", "ray"]  # the registry's names (a test keeps them in step with ENGINES)


@dataclass
class EngineFlags:
    """Where a command's parts are made (:mod:`halsift.execution.engines`). Changing these never changes what is
    made (they are run-only: :data:`RUN_ONLY`)."""

    engine: EngineName = field("local", help="local: this process, or every rank under `halsift launch` (tasks when "
                                             "--num-tasks or a SLURM array task's environment is given); tasks: one "
                                             "of --num-tasks independent tasks; ray: the parts on a Ray cluster, "
                                             "one actor per GPU (else per CPU), parts dealt as actors free up (pip "
                                             "install 'halsift[ray]')", cli=GROUP)
    num_tasks: int | None = field(None, range="[1, inf)", help="run as one of N independent tasks sharing --out (default: "
                                             "$SLURM_ARRAY_TASK_COUNT in an array job); the last task to finish "
                                             "writes the complete manifest", cli={**GROUP, "metavar": "N"})
    task_index: int | None = field(None, range="[0, inf)", help="this task's index, 0..N-1 (default: $SLURM_ARRAY_TASK_ID - "
                                              "$SLURM_ARRAY_TASK_MIN)", cli={**GROUP, "metavar": "I"})
    claim_timeout: float | None = field(None, range="(0, inf)", help="take over a part whose claim has had no heartbeat for S seconds "
                                                   "(a dead node; default 600)", cli={**GROUP, "metavar": "S"})
    address: str | None = field(None, help="--engine ray: the cluster to join, e.g. auto or ray://head:10001 "
                                           "(default: a local one)", cli=GROUP)
    workers: int | None = field(None, range="[1, inf)", help="--engine ray: actors making parts (default: one per GPU of the "
                                           "cluster, else per CPU)", cli=GROUP)
    decode_workers: int = field(0, range="[0, inf)", help="read, decode and preprocess (or make whole parts, for stages without a "
                                        "model) in N processes per rank; 0: in this process (default). Use the cores "
                                        "per rank minus one: the model's process needs a core of its own",
                                cli={**GROUP, "metavar": "N"})

    def engine_flags(self) -> dict:
        """The flags as a job takes them (``engine`` apart)."""
        from halsift.execution.job import ENGINE_FLAGS

        return {f: getattr(self, f) for f in ENGINE_FLAGS}


# settings that change how a run goes, never what it makes: left out of every identity and every recipe fingerprint,
# recorded in a score manifest's run_settings. One list for `halsift score`, the library and recipes.
RUN_ONLY = ("engine", "num_tasks", "task_index", "claim_timeout", "address", "workers", "decode_workers", "device",
            "no_progress", "show_progress", "full_hash", "batch_size", "max_parse_failures", "wandb",
            "wandb_project")

__all__ = ["EngineFlags", "EngineName", "GROUP", "RUN_ONLY"]
