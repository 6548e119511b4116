"""``halsift launch``: run a halsift command on several processes, GPUs or nodes, or write/submit an sbatch script."""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

HELP = "run a halsift command under torchrun / accelerate launch, or as a SLURM job (--slurm)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", type=int, default=None, help="processes per node, one per GPU")
    p.add_argument("--cpu", type=int, default=None, metavar="N",
                   help="N CPU processes (gloo) instead of GPUs (per node; with --slurm: no GPU request, torchrun)")
    p.add_argument("--nodes", type=int, default=1, help="number of nodes")
    p.add_argument("--node-rank", type=int, default=0, help="this node's rank (0 .. nodes-1)")
    p.add_argument("--master-addr", default="127.0.0.1", help="address of the rank-0 node")
    p.add_argument("--master-port", type=int, default=29500, help="rendezvous port")
    p.add_argument("--backend", choices=("auto", "torchrun", "accelerate"), default="auto",
                   help="launcher; auto = torchrun on CPU (accelerate --cpu starts a single process), accelerate on GPU")
    p.add_argument("--dry-run", action="store_true", help="print the command or script, run nothing")
    s = p.add_argument_group("SLURM")
    s.add_argument("--slurm", action="store_true", help="write an sbatch script instead of running locally")
    s.add_argument("--script", default="halsift_job.sbatch", help="where to write the sbatch script")
    s.add_argument("--submit", action="store_true", help="submit the script with sbatch after writing it")
    s.add_argument("--wait", action="store_true",
                   help="with --submit: wait for the job to end (sbatch --wait) and exit with its exit code")
    s.add_argument("--output", default="slurm-%j.out", help="job log file (%%j = job id; default slurm-%%j.out)")
    s.add_argument("--python", default=None,
                   help="interpreter each task runs (default: this one, or `python` on PATH when --setup is given)")
    s.add_argument("--partition", default=None)
    s.add_argument("--account", default=None)
    s.add_argument("--qos", default=None)
    s.add_argument("--time", default="24:00:00", help="wall-time limit")
    s.add_argument("--cpus-per-task", type=int, default=32)
    s.add_argument("--job-name", default="halsift")
    s.add_argument("--setup", action="append", default=[], help="shell line run before srun (repeatable)")
    from halsift.launch.slurm_array import add_array_arguments

    add_array_arguments(s)
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="command", help="-- then the halsift command and its flags")


def run(args: argparse.Namespace) -> int:
    from halsift.launch.cli import UsageError
    from halsift.launch.launchers import LaunchSpec, SlurmSpec, launch_command, sbatch_script
    from halsift.launch.slurm_array import array_text

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
    for flag, value in (("--gpus", args.gpus), ("--cpu", args.cpu)):
        if value is not None and value < 1:
            raise UsageError(f"{flag}: expected >= 1, got {value}")
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
        code = subprocess.call(argv, env=env)
        errors = Path(env[ERROR_FILE_ENV])
        lines = errors.read_text(encoding="utf-8").splitlines() if errors.exists() else []
    if code != 0 and lines:  # a user error in the ranks: its one line (again, after the launcher's report), exit 2
        print(lines[0], file=sys.stderr)
        return 2
    return code
