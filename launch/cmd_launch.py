"""``halsift launch``: run a halsift command on several processes, GPUs or nodes, or write/submit an sbatch script."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from halsift.corpus.config import add_dataclass_arguments, config_from_args, field
from halsift.launch.describe import add_describe_argument
from halsift.launch.launchers import LaunchSpec, SbatchOptions

HELP = "run a halsift command under torchrun / accelerate launch, or as a SLURM job (--slurm)"
STOP_WAIT_S = 60.0  # how long a SIGTERM'd launcher gets to stop its ranks before it is killed
_SLURM = {"group": "SLURM"}  # the flags' argument group
_ONE = {"append": True}  # one value per flag, repeated (`--setup A --setup B`)


@dataclass
class LaunchConfig:
    """``halsift launch``'s flags; after them ``--`` and the halsift command to run (``halsift launch --gpus 8 --
    score ...``)."""

    gpus: int | None = field(None, range="[1, inf)", help="processes per node, one per GPU")
    cpu: int | None = field(None, range="[1, inf)",
                            help="N CPU processes (gloo) instead of GPUs (per node; with --slurm: no GPU "
                                 "request, torchrun)", cli={"metavar": "N"})
    nodes: int = field(LaunchSpec.nodes, range="[1, inf)", help="number of nodes")
    node_rank: int = field(LaunchSpec.node_rank, range="[0, inf)", help="this node's rank (0 .. nodes-1)")
    master_addr: str = field(LaunchSpec.master_addr, help="address of the rank-0 node")
    master_port: int = field(LaunchSpec.master_port, range="[1, 65535]", help="rendezvous port")
    backend: Literal["auto", "torchrun", "accelerate"] = field(
        LaunchSpec.backend, help="launcher; auto = torchrun on CPU (accelerate --cpu starts a single process), "
                                 "accelerate on GPU")
    dry_run: bool = field(False, help="print the command or script, run nothing")
    slurm: bool = field(False, help="write an sbatch script instead of running locally", cli=_SLURM)
    script: str = field("halsift_job.sbatch", help="where to write the sbatch script", cli=_SLURM)
    submit: bool = field(False, help="submit the script with sbatch after writing it", cli=_SLURM)
    wait: bool = field(False, help="with --submit: wait for the job to end (sbatch --wait) and exit with its exit "
                                   "code", cli=_SLURM)
    output: str = field(SbatchOptions.output, help="job log file (%j = job id; with --array the default is "
                                                   "slurm-%A_%a.out)", cli=_SLURM)
    python: str | None = field(None, help="interpreter each task runs (default: this one, or `python` on PATH when "
                                          "--setup is given)", cli=_SLURM)
    partition: str | None = field(None, help="SLURM partition (default: the cluster's)", cli=_SLURM)
    account: str | None = field(None, help="SLURM account to charge (default: yours)", cli=_SLURM)
    qos: str | None = field(None, help="SLURM quality of service (default: the cluster's)", cli=_SLURM)
    time: str = field(SbatchOptions.time, help="wall-time limit", cli=_SLURM)
    cpus_per_task: int = field(SbatchOptions.cpus_per_task, range="[1, inf)",
                               help="CPUs per task (per node, or per array task)",
                               cli=_SLURM)
    job_name: str = field(SbatchOptions.job_name, help="SLURM job name", cli=_SLURM)
    setup: list[str] = field(default_factory=list, help="one shell line run before the command, as written (module "
                                                        "load, venv activate; repeatable)", cli={**_SLURM, **_ONE})
    array: int | None = field(None, range="[1, inf)",
                              help="a job array of N independent single-GPU tasks running `score --num-tasks "
                                   "N` (no process group; a dead task loses only its current part; rerun one "
                                   "with sbatch --array=I SCRIPT)", cli={**_SLURM, "metavar": "N"})
    max_parallel: int | None = field(None, range="[1, inf)",
                                     help="with --array: at most M tasks at once (#SBATCH --array=0-(N-1)%M)",
                                     cli={**_SLURM, "metavar": "M"})
    requeue: bool = field(False, help="with --array: requeue a task after node failure/preemption", cli=_SLURM)
    sbatch_extra: list[str] = field(default_factory=list, help="extra sbatch option, e.g. "
                                                               "--sbatch-extra=--constraint=a100 (repeatable)",
                                    cli={**_SLURM, **_ONE, "metavar": "OPT"})


CONFIG = LaunchConfig  # the settings (docs/config.md, --describe)


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags of :class:`LaunchConfig` (one definition for flags, ``--describe`` and docs/config.md), then the
    command."""
    add_dataclass_arguments(p, LaunchConfig, config_file=False, defaults=True)
    add_describe_argument(p, LaunchConfig)
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="command",
                   help="-- then the halsift command and its flags")


def run(args: argparse.Namespace) -> int:
    from halsift.launch.cli import UsageError
    from halsift.launch.launchers import LaunchSpec, SlurmSpec, launch_command, sbatch_script
    from halsift.launch.slurm_array import array_text

    config_from_args(LaunchConfig, args)  # every declared range (--gpus, --nodes, --master-port, --array ...)
    command = list(args.argv)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("no command given: use `halsift launch [options] -- <halsift command> ...`")
    if command[0] in ("launch", "halsift"):
        raise UsageError(f"command: give the halsift subcommand itself (e.g. `-- score ...`), not {command[0]!r}")
    if args.gpus is not None and args.cpu is not None:
        raise UsageError("--gpus and --cpu are exclusive")
    if (args.max_parallel is not None or args.requeue) and args.array is None:
        raise UsageError("--max-parallel/--requeue: only with --slurm --array N")
    if args.array is not None and not args.slurm:
        raise UsageError("--array: a SLURM job array; add --slurm")
    if args.slurm:
        if args.wait and not args.submit:
            raise UsageError("--wait: only with --submit")
        backend = args.backend if args.backend != "auto" else ("torchrun" if args.cpu is not None else "accelerate")
        spec = SlurmSpec(nodes=args.nodes, gpus_per_node=args.gpus or 1, cpus_per_task=args.cpus_per_task,
                         time=args.time, partition=args.partition, account=args.account, qos=args.qos,
                         job_name=args.job_name, output=args.output, master_port=args.master_port,
                         backend=backend, cpu_procs=args.cpu, setup=args.setup)
        python = args.python or ("python" if args.setup else sys.executable)
        spec.extra_sbatch = list(args.sbatch_extra)
        try:
            text = array_text(args, command, python) if args.array is not None else sbatch_script(spec, command, python)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if args.dry_run:
            print(text, end="")
            return 0
        path = Path(args.script)
        path.write_text(text)
        print(f"wrote {path}", flush=True)
        if args.submit:
            if shutil.which("sbatch") is None:
                raise UsageError("--submit: sbatch not found on PATH (script written; submit it where SLURM is)")
            return subprocess.call(["sbatch", *(["--wait"] if args.wait else []), str(path)])
        return 0
    spec = LaunchSpec(procs_per_node=args.cpu or args.gpus or 1, nodes=args.nodes, node_rank=args.node_rank,
                      master_addr=args.master_addr, master_port=args.master_port, cpu=args.cpu is not None,
                      backend=args.backend)
    try:
        argv = launch_command(spec, command)
    except ValueError as e:
        raise UsageError(str(e)) from None
    print("+ " + " ".join(shlex.quote(a) for a in argv), file=sys.stderr)
    if args.dry_run:
        return 0
    env = dict(os.environ)
    if args.nodes == 1:  # one id shared by the ranks of this launch (`halsift run` under launch: recipe_ranks)
        import uuid

        env.setdefault("HALSIFT_LAUNCH_ID", uuid.uuid4().hex)
    if spec.cpu:
        env.setdefault("OMP_NUM_THREADS", "1")
        env["HALSIFT_FORCE_CPU"] = "1"
    import tempfile

    from halsift.launch.cli import ERROR_FILE_ENV

    with tempfile.TemporaryDirectory(prefix="halsift-launch-") as tmp:
        env[ERROR_FILE_ENV] = str(Path(tmp) / "errors.txt")
        code = _call(argv, env)
        errors = Path(env[ERROR_FILE_ENV])
        lines = errors.read_text(encoding="utf-8").splitlines() if errors.exists() else []
    if code != 0 and lines:  # a user error in the ranks: its one line (again, after the launcher's report), exit 2
        print(lines[0], file=sys.stderr)
        return 2
    return code


def _call(argv: list[str], env: dict) -> int:
    """``subprocess.call``, except that a SIGTERM of this process is passed on to the launcher (which stops its
    ranks, each saying what it kept) instead of killing it outright."""
    from halsift.launch.cli import Terminated

    proc = subprocess.Popen(argv, env=env)
    try:
        return proc.wait()
    except Terminated:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    except BaseException:  # Ctrl-C (the launcher's process group got it too) or an error here: as subprocess.call
        proc.kill()
        raise
