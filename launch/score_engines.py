"""``halsift score`` as independent tasks (``--num-tasks``/``--task-index``, or a SLURM array task's environment)
or on Ray (``--engine ray``): the run that replaces the rank-split one when their flags (``ScoreConfig``'s scale-out
group) are given."""

from __future__ import annotations

from typing import TYPE_CHECKING
import json
from pathlib import Path

if TYPE_CHECKING:
    from halsift.launch.cmd_score import ScoreConfig


def run_tasks(cfg: ScoreConfig) -> int | None:
    """Run the task / Ray form of ``score`` when asked for; ``None`` when the ordinary run applies."""
    from halsift.filtering.detectors.base import DetectorError
    from halsift.filtering.scoring.parts import MANIFEST, RunMismatch
    from halsift.filtering.scoring.tasks import STALE_AFTER_S, TaskError, score_task, task_from_env
    from halsift.launch.cli import UsageError

    stale = STALE_AFTER_S if cfg.claim_timeout is None else cfg.claim_timeout
    if cfg.decode_workers and (cfg.engine == "ray" or task_from_env(cfg.num_tasks, cfg.task_index) is not None):
        raise UsageError("--decode-workers: not honoured by independent tasks (--num-tasks, a SLURM array) or "
                         "--engine ray yet; drop it there (each task reads with its read-ahead thread)")
    if cfg.engine != "ray" and (cfg.address is not None or cfg.workers is not None):
        raise UsageError("--address/--workers: only with --engine ray")
    try:
        if cfg.engine == "ray":
            if cfg.num_tasks is not None or cfg.task_index is not None or cfg.claim_timeout is not None:
                raise UsageError("--engine ray: Ray deals the parts itself; drop --num-tasks/--task-index/"
                                 "--claim-timeout")
            if cfg.workers is not None and cfg.workers < 1:
                raise UsageError(f"--workers: expected >= 1, got {cfg.workers}")
            from halsift.filtering.scoring.ray_engine import score_ray

            m = score_ray(cfg.detector, cfg.data, cfg.out, unit=cfg.unit, batch_size=cfg.batch_size,
                          device=cfg.device, address=cfg.address, workers=cfg.workers,
                          show_progress=not cfg.no_progress, max_parse_failures=cfg.max_parse_failures)
            print(f"ray: {m['workers']} workers, {m['parts_redone']} parts redone after a worker died", flush=True)
            summary(Path(cfg.out) / MANIFEST, cfg)
            return 0
        task = task_from_env(cfg.num_tasks, cfg.task_index)
        if task is None:
            if cfg.claim_timeout is not None:
                raise UsageError("--claim-timeout: only with --num-tasks (or in a SLURM array task)")
            return None
        n, i = task
        run = score_task(cfg.detector, cfg.data, cfg.out, n, i, unit=cfg.unit, batch_size=cfg.batch_size,
                         device=cfg.device, show_progress=not cfg.no_progress, stale_after=stale,
                         max_parse_failures=cfg.max_parse_failures)
    except TaskError as e:
        raise UsageError(str(e)) from None
    except RunMismatch as e:
        raise UsageError(f"--out: {e}") from e
    except DetectorError as e:
        raise UsageError(f"--detector: {e}") from e
    print(f"task {i}/{n}: scored {run['parts_scored']} parts ({run['sentences']} items), "
          f"{run['parts_skipped_done']} already done, {run['parts_taken_over']} taken over from dead tasks",
          flush=True)
    if run["complete"]:
        summary(Path(cfg.out) / MANIFEST, cfg)
    else:
        print(f"task {i}/{n}: {run['parts_missing']} parts not written yet ({len(run['held_by_live_tasks'])} held "
              f"by running tasks); the last task to finish completes {Path(cfg.out) / MANIFEST}", flush=True)
    return 0


def summary(manifest: Path, cfg: ScoreConfig | None = None) -> None:
    """The one-line result of a finished score run (and its wandb run when ``cfg.wandb`` asks for one)."""
    m = json.loads(manifest.read_text())
    print(f"scored {m['sentences']} items of {m['samples']} samples in {m['parts']} parts "
          f"({m['sentences_per_s']} items/s this run); skipped {m['skipped']['total']}, "
          f"parse failures {m['parse_failures']} -> {manifest.parent}", flush=True)
    if cfg is not None:
        from halsift.launch.run_wandb import log_score

        log_score(cfg, manifest)
