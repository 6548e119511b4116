"""``halsift score`` as independent tasks (``--num-tasks``/``--task-index``, or a SLURM array task's environment)
or on Ray (``--engine ray``): the run that replaces the rank-split one when their flags (``ScoreConfig``'s scale-out
group) are given."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def run_tasks(args: argparse.Namespace) -> int | None:
    """Run the task / Ray form of ``score`` when asked for; ``None`` when the ordinary run applies."""
    from halsift.filtering.detectors.base import DetectorError
    from halsift.filtering.scoring.parts import MANIFEST, RunMismatch
    from halsift.filtering.scoring.tasks import STALE_AFTER_S, TaskError, score_task, task_from_env
    from halsift.launch.cli import UsageError

    stale = STALE_AFTER_S if args.claim_timeout is None else args.claim_timeout
    if args.decode_workers and (args.engine == "ray" or task_from_env(args.num_tasks, args.task_index) is not None):
        raise UsageError("--decode-workers: not honoured by independent tasks (--num-tasks, a SLURM array) or "
                         "--engine ray yet; drop it there (each task reads with its read-ahead thread)")
    if args.engine != "ray" and (args.address is not None or args.workers is not None):
        raise UsageError("--address/--workers: only with --engine ray")
    try:
        if args.engine == "ray":
            if args.num_tasks is not None or args.task_index is not None or args.claim_timeout is not None:
                raise UsageError("--engine ray: Ray deals the parts itself; drop --num-tasks/--task-index/"
                                 "--claim-timeout")
            if args.workers is not None and args.workers < 1:
                raise UsageError(f"--workers: expected >= 1, got {args.workers}")
            from halsift.filtering.scoring.ray_engine import score_ray

            m = score_ray(args.detector, args.data, args.out, unit=args.unit, batch_size=args.batch_size,
                          device=args.device, address=args.address, workers=args.workers,
                          show_progress=not args.no_progress, max_parse_failures=args.max_parse_failures)
            print(f"ray: {m['workers']} workers, {m['parts_redone']} parts redone after a worker died", flush=True)
            summary(Path(args.out) / MANIFEST, args)
            return 0
        task = task_from_env(args.num_tasks, args.task_index)
        if task is None:
            if args.claim_timeout is not None:
                raise UsageError("--claim-timeout: only with --num-tasks (or in a SLURM array task)")
            return None
        n, i = task
        run = score_task(args.detector, args.data, args.out, n, i, unit=args.unit, batch_size=args.batch_size,
                         device=args.device, show_progress=not args.no_progress, stale_after=stale,
                         max_parse_failures=args.max_parse_failures)
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
        summary(Path(args.out) / MANIFEST, args)
    else:
        print(f"task {i}/{n}: {run['parts_missing']} parts not written yet ({len(run['held_by_live_tasks'])} held "
              f"by running tasks); the last task to finish completes {Path(args.out) / MANIFEST}", flush=True)
    return 0


def summary(manifest: Path, args: argparse.Namespace | None = None) -> None:
    """The one-line result of a finished score run (and its wandb run when ``args.wandb`` asks for one)."""
    m = json.loads(manifest.read_text())
    print(f"scored {m['sentences']} items of {m['samples']} samples in {m['parts']} parts "
          f"({m['sentences_per_s']} items/s this run); skipped {m['skipped']['total']}, "
          f"parse failures {m['parse_failures']} -> {manifest.parent}", flush=True)
    if args is not None:
        from halsift.launch.run_wandb import log_score

        log_score(args, manifest)
