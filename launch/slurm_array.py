"""SLURM job arrays for ``halsift score`` (and ``select``): one sbatch script, N independent single-process tasks.

Each array task runs ``halsift score ... --num-tasks N --task-index $SLURM_ARRAY_TASK_ID`` on one GPU (or CPUs
with ``--cpu``) of one node: no process group, no rendezvous, no barrier. Tasks share the output folder through
the claims of :mod:`halsift.execution.claims`, so a task that dies loses only its current part, any running task
takes over what a dead one held, and a failed task is rerun alone with ``sbatch --array=I <script>``.

A generated sbatch script rather than submitit: submitit pickles a Python callable and its arguments to the shared
file system and unpickles them on the node (halsift never unpickles files), needs the same interpreter and package
on every node, and gives the user nothing to read, edit or resubmit; a script is plain text that ``sbatch``,
``scontrol requeue`` and site tooling understand, and it extends the sbatch writer halsift already tests on a real
SLURM. What submitit adds beyond that (requeue on preemption, per-task logs) is one ``#SBATCH`` line each.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from halsift.launch.launchers import ENTRY, SbatchOptions, sbatch_common, sbatch_header, script_value, shell_command

ARRAY_COMMANDS = ("score", "select", "embed", "basic", "dedup")  # the commands that take --num-tasks/--task-index
TASK_ID = '"$SLURM_ARRAY_TASK_ID"'


@dataclass
class ArraySpec(SbatchOptions):
    """sbatch options for an array of ``tasks`` single-process tasks, at most ``max_parallel`` at once."""

    cpus_per_task: int = 8
    output: str = "slurm-%A_%a.out"
    tasks: int = 1
    max_parallel: int | None = None
    requeue: bool = False
    gpus: int = 1  # per task; 0 = CPU only

    def validate(self) -> None:
        if self.tasks < 1:
            raise ValueError(f"--array: expected >= 1 tasks, got {self.tasks}")
        if self.max_parallel is not None and self.max_parallel < 1:
            raise ValueError(f"--max-parallel: expected >= 1, got {self.max_parallel}")
        if self.gpus not in (0, 1):
            raise ValueError(f"--array: each task is one process on one GPU (got --gpus {self.gpus}); ask for "
                             f"more tasks instead, e.g. --array {self.tasks * max(self.gpus, 1)}")
        if self.cpus_per_task < 1:
            raise ValueError(f"--cpus-per-task: expected >= 1, got {self.cpus_per_task}")
        for x in self.extra_sbatch:
            if x.split("=", 1)[0] in ("--array", "--nodes", "--ntasks"):
                raise ValueError(f"--sbatch-extra {x!r}: set by --array itself (one node, one task per array task)")


def task_command(command: Sequence[str], tasks: int) -> list[str]:
    """``command`` with ``--num-tasks`` / ``--task-index`` appended (the index as an unquoted shell variable)."""
    if not command or command[0] not in ARRAY_COMMANDS:
        raise ValueError(f"--array: runs `halsift {'`, `'.join(ARRAY_COMMANDS)}` as independent tasks, not "
                         f"{command[0] if command else '?'!r} (train/eval run once: submit them without --array)")
    given = {a.split("=", 1)[0] for a in command}
    if "--task-index" in given:
        raise ValueError("--array: sets --task-index itself from $SLURM_ARRAY_TASK_ID; drop it from the command")
    if "--num-tasks" in given:
        raise ValueError(f"--array: sets --num-tasks itself ({tasks}); drop it from the command")
    if command[0] in ("score", "embed", "basic", "dedup") and "--engine" in given:
        raise ValueError("--array: each task runs on the local engine; drop --engine")
    return [*command, "--num-tasks", str(tasks), "--task-index", TASK_ID]


def array_script(spec: ArraySpec, command: Sequence[str], python: str = "python") -> str:
    """Text of an sbatch script running ``halsift <command>`` as ``spec.tasks`` array tasks."""
    spec.validate()
    argv = task_command(command, spec.tasks)
    throttle = f"%{spec.max_parallel}" if spec.max_parallel else ""
    headers, setup = sbatch_common(spec)
    lines = ["#!/bin/bash", sbatch_header("job-name", spec.job_name),
             sbatch_header("array", f"0-{spec.tasks - 1}{throttle}"), sbatch_header("nodes", 1),
             sbatch_header("ntasks", 1)]
    if spec.gpus:
        lines.append(sbatch_header("gpus", spec.gpus))
    lines += [sbatch_header("cpus-per-task", spec.cpus_per_task), sbatch_header("time", spec.time),
              sbatch_header("output", spec.output)]
    if spec.requeue:  # requeued after a node failure or preemption; the log goes on in the same file
        lines += [sbatch_header("requeue"), sbatch_header("open-mode", "append")]
    lines += headers
    lines += ["", "# rerun one failed task alone: sbatch --array=I this-script", "set -euo pipefail", *setup,
              "export HALSIFT_QUIET=1 WANDB_MODE=${WANDB_MODE:-offline}"]
    if not spec.gpus:
        lines.append("export HALSIFT_FORCE_CPU=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-$SLURM_CPUS_PER_TASK}")
    # the last word is the task index, a shell variable; every other word is quoted (not compared by value: a
    # command word that spells TASK_ID stays a literal)
    quoted = f"{script_value('--python', python)} {shell_command([*ENTRY, *argv[:-1]])} {argv[-1]}"
    lines += ['echo "halsift: array task $SLURM_ARRAY_TASK_ID of ' + str(spec.tasks) +
              ' on $(hostname) (job ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}, restart ${SLURM_RESTART_COUNT:-0})"',
              f"exec {quoted}"]
    return "\n".join(lines) + "\n"


def array_text(args: argparse.Namespace, command: Sequence[str], python: str) -> str:
    """The array script for ``halsift launch --slurm --array N ...`` (its parsed flags)."""
    if args.nodes != 1:
        raise ValueError("--array: every task is one node; drop --nodes (ask for more tasks instead)")
    if args.cpu is not None and args.cpu != 1:
        raise ValueError(f"--array: every task is one process; use --cpu 1 (got --cpu {args.cpu}), more tasks instead")
    spec = ArraySpec(tasks=args.array, max_parallel=args.max_parallel, requeue=args.requeue,
                     gpus=0 if args.cpu is not None else (1 if args.gpus is None else args.gpus),
                     cpus_per_task=args.cpus_per_task, time=args.time, partition=args.partition,
                     account=args.account, qos=args.qos, job_name=args.job_name,
                     output="slurm-%A_%a.out" if args.output == "slurm-%j.out" else args.output,
                     setup=list(args.setup), extra_sbatch=list(args.sbatch_extra))
    return array_script(spec, command, python)
