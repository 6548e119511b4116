"""Build launcher command lines (torchrun, ``accelerate launch``) and SLURM sbatch scripts.

Launchers stay thin: every halsift command is the same module (``python -m halsift.launch.cli``) under
``python``, ``torchrun``, ``accelerate launch`` or ``srun``; rank and world size come from the environment the
launcher sets, read by accelerate's ``PartialState``. Nothing here schedules work itself.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

ENTRY = ["-m", "halsift.launch.cli"]


@dataclass
class LaunchSpec:
    """Where and how many processes run one halsift command."""

    procs_per_node: int = 1  # GPUs per node, or CPU processes with cpu=True
    nodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    cpu: bool = False
    backend: str = "auto"  # torchrun | accelerate | auto (torchrun on CPU: accelerate --cpu runs one process)
    env: dict[str, str] = field(default_factory=dict)

    def validate(self) -> None:
        if self.procs_per_node < 1:
            raise ValueError(f"--gpus/--procs must be >= 1, got {self.procs_per_node}")
        if self.nodes < 1:
            raise ValueError(f"--nodes must be >= 1, got {self.nodes}")
        if not 0 <= self.node_rank < self.nodes:
            raise ValueError(f"--node-rank must be in [0, {self.nodes}), got {self.node_rank}")
        if self.backend not in ("auto", "torchrun", "accelerate"):
            raise ValueError(f"--backend must be torchrun, accelerate or auto, got {self.backend!r}")

    @property
    def resolved_backend(self) -> str:
        if self.backend != "auto":
            return self.backend
        return "torchrun" if self.cpu else "accelerate"


def launch_command(spec: LaunchSpec, command: Sequence[str], python: str = sys.executable) -> list[str]:
    """The argv that starts ``halsift <command>`` on this node under the chosen launcher."""
    spec.validate()
    if spec.resolved_backend == "torchrun":
        argv = [python, "-m", "torch.distributed.run", f"--nproc_per_node={spec.procs_per_node}",
                f"--nnodes={spec.nodes}", f"--node_rank={spec.node_rank}",
                f"--master_addr={spec.master_addr}", f"--master_port={spec.master_port}"]
    else:
        argv = [python, "-m", "accelerate.commands.launch", f"--num_processes={spec.procs_per_node * spec.nodes}",
                f"--num_machines={spec.nodes}", f"--machine_rank={spec.node_rank}",
                f"--main_process_ip={spec.master_addr}", f"--main_process_port={spec.master_port}"]
        if spec.cpu:
            argv.append("--cpu")
        elif spec.procs_per_node * spec.nodes > 1:
            argv.append("--multi_gpu")
    return argv + ENTRY + list(command)


@dataclass
class SbatchOptions:
    """The ``#SBATCH`` header values and setup lines every halsift job script shares."""

    cpus_per_task: int = 32
    time: str = "24:00:00"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    job_name: str = "halsift"
    output: str = "slurm-%j.out"
    setup: list[str] = field(default_factory=list)  # shell lines before the command (module load, venv activate)
    extra_sbatch: list[str] = field(default_factory=list)  # raw "--key=value" lines


@dataclass
class SlurmSpec(SbatchOptions):
    """sbatch options for a multi-node job: one task per node, the launcher inside spawns the per-GPU ranks.

    ``cpu_procs`` set: a CPU-only job (no GPU request; ``cpu_procs`` gloo ranks per node under torchrun, since
    ``accelerate launch --cpu`` starts a single process), e.g. for CPU partitions or a CI SLURM without GPUs.
    """

    nodes: int = 1
    gpus_per_node: int = 8
    master_port: int = 29500
    backend: str = "accelerate"  # accelerate | torchrun
    cpu_procs: int | None = None  # CPU ranks per node instead of GPUs (torchrun only)

    def validate(self) -> None:
        if self.backend not in ("accelerate", "torchrun"):
            raise ValueError(f"--backend must be accelerate or torchrun, got {self.backend!r}")
        if self.nodes < 1:
            raise ValueError(f"--nodes must be >= 1, got {self.nodes}")
        if self.cpus_per_task < 1:
            raise ValueError(f"--cpus-per-task must be >= 1, got {self.cpus_per_task}")
        if self.cpu_procs is not None:
            if self.cpu_procs < 1:
                raise ValueError(f"--cpu must be >= 1, got {self.cpu_procs}")
            if self.backend != "torchrun":
                raise ValueError("--cpu under SLURM runs torchrun (accelerate --cpu starts one process): "
                                 "use --backend torchrun or auto")
        elif self.gpus_per_node < 1:
            raise ValueError(f"--gpus must be >= 1, got {self.gpus_per_node}")

    @property
    def procs_per_node(self) -> int:
        return self.cpu_procs if self.cpu_procs is not None else self.gpus_per_node


# what each kind of script value may not hold (see :func:`script_value`)
_BAD = {"header": (re.compile(r"[\x00-\x1f\x7f\"'`$\\]"), "control characters, quotes, backslashes, '$' or '`'"),
        "option": (re.compile(r"[\x00-\x1f\x7f]"), "control characters"),
        "line": (re.compile(r"[\x00\n\r]"), "a NUL, newline or carriage return (give one --setup per line)"),
        "word": (re.compile(r"\x00"), "a NUL character")}


def script_value(flag: str, value, kind: str = "word") -> str:
    """Every value written into an sbatch script (array or not) passes here: checked, then quoted for its place.

    ``kind``: ``header`` (an ``#SBATCH --key=VALUE`` value: no control characters -- a newline would start a shell
    line -- quotes, backslashes, ``$`` or backquotes; double-quoted when it holds spaces, which sbatch reads),
    ``option`` (a whole ``--key=value`` sbatch option, ``--sbatch-extra``: starts with ``--``, no control
    characters), ``line`` (a ``--setup`` shell line, run as written: no NUL, newline or carriage return) or
    ``word`` (one word of a shell command: no NUL, then ``shlex.quote``). A bad value is a ``ValueError`` naming
    ``flag``, in one line."""
    text = str(value)
    bad = _BAD[kind][0].search(text)
    if bad:
        raise ValueError(f"{flag}: {text[:80]!r} contains {bad.group()!r} at position {bad.start()}; "
                         f"{'a script value' if kind == 'word' else 'it'} may not hold {_BAD[kind][1]}")
    if kind == "option" and not text.startswith("--"):
        raise ValueError(f"{flag}: expected one sbatch option starting with '--', got {text[:80]!r}")
    if kind == "word":
        return shlex.quote(text)
    if kind == "header" and any(c.isspace() for c in text):
        return f'"{text}"'
    return text


def sbatch_header(key: str, value=None, flag: str | None = None) -> str:
    """``#SBATCH --key`` or ``#SBATCH --key=value`` (value checked and quoted by :func:`script_value`, errors naming
    ``flag``, by default ``--key``)."""
    if value is None:
        return f"#SBATCH --{key}"
    return f"#SBATCH --{key}={script_value(flag or f'--{key}', value, 'header')}"


def sbatch_common(spec: SbatchOptions) -> tuple[list[str], list[str]]:
    """The ``#SBATCH`` lines for the optional settings both writers share (partition, account, qos, then the
    ``--sbatch-extra`` options) and the ``--setup`` lines, all through :func:`script_value`."""
    headers = [sbatch_header(key, getattr(spec, key)) for key in ("partition", "account", "qos") if getattr(spec, key)]
    headers += [f"#SBATCH {script_value('--sbatch-extra', x, 'option')}" for x in spec.extra_sbatch]
    return headers, [script_value("--setup", x, "line") for x in spec.setup]


def shell_command(words: Sequence[str], flag: str = "command") -> str:
    """A command line of shell words, each through :func:`script_value` (``shlex.quote``)."""
    return " ".join(script_value(flag, w) for w in words)


def sbatch_script(spec: SlurmSpec, command: Sequence[str], python: str = "python") -> str:
    """Text of an sbatch script that runs ``halsift <command>`` across ``spec.nodes`` nodes.

    ``srun`` starts one task per node; each task runs the launcher with the rendezvous on the first node and its
    node rank from SLURM (``$SLURM_NODEID``), so no rank bookkeeping is done here. tqdm is silenced
    through ``HALSIFT_QUIET`` (bars in SLURM logs are noise). ``python`` is the interpreter each task runs: give
    an absolute path (the CLI passes its own) unless ``spec.setup`` activates the environment.
    """
    spec.validate()
    cpu = spec.cpu_procs is not None
    headers, setup = sbatch_common(spec)
    lines = ["#!/bin/bash", sbatch_header("job-name", spec.job_name), sbatch_header("nodes", spec.nodes),
             sbatch_header("ntasks-per-node", 1)]
    if not cpu:
        lines.append(sbatch_header("gpus-per-node", spec.gpus_per_node, "--gpus"))
    lines += [sbatch_header("cpus-per-task", spec.cpus_per_task), sbatch_header("time", spec.time),
              sbatch_header("output", spec.output), *headers]
    lines += ["", "set -euo pipefail", *setup,
              # rendezvous on the first node, at its NodeAddr: the address slurmctld itself reaches it by, which is
              # its NodeName unless the cluster maps names to other addresses (then the name may not resolve).
              'MASTER_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
              'MASTER_ADDR=$(scontrol show node "$MASTER_NODE" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2 || true)',
              'export MASTER_ADDR=${MASTER_ADDR:-$MASTER_NODE}',
              f"export MASTER_PORT={int(spec.master_port)}", "export HALSIFT_QUIET=1 WANDB_MODE=${WANDB_MODE:-offline}",
              # one id for the ranks of this job (and attempt): `halsift run` under it (recipe_ranks)
              "export HALSIFT_LAUNCH_ID=${HALSIFT_LAUNCH_ID:-slurm-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}}"]
    if cpu:
        lines.append("export HALSIFT_FORCE_CPU=1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}")
    lines.append("")
    cmd = shell_command([*ENTRY, *command])
    py = script_value("--python", python)
    total = spec.nodes * spec.procs_per_node
    # static rendezvous for both backends: the node rank is SLURM's, the store on the first node. Not c10d: its
    # agents poll the store while their workers run (`num_nodes_waiting`), and one whose peer agent (hosting the
    # store) has already exited fails the job with RendezvousConnectionError although every worker finished (seen on
    # a loaded 2-node run; pytorch/pytorch#69197, torchtune#2676). A SLURM allocation has a fixed node count, so
    # nothing elastic is lost. accelerate hands torch.distributed.run the same arguments as the torchrun backend
    # (--node_rank, --master_addr, --master_port) with --rdzv_backend=static --same_network.
    if spec.backend == "accelerate":
        inner = (f"{py} -m accelerate.commands.launch --num_processes={total} --num_machines={spec.nodes} "
                 f"--machine_rank=$SLURM_NODEID --main_process_ip=$MASTER_ADDR --main_process_port=$MASTER_PORT "
                 f"--rdzv_backend=static --same_network {'--multi_gpu ' if total > 1 else ''}{cmd}")
    else:
        inner = (f"{py} -m torch.distributed.run --nnodes={spec.nodes} --nproc_per_node={spec.procs_per_node} "
                 f"--node_rank=$SLURM_NODEID --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT {cmd}")
    # single quotes: $SLURM_NODEID must expand inside each task, not once in the batch shell. --cpus-per-task is
    # repeated on srun: since Slurm 22.05 srun does not inherit sbatch's (srun(1), --cpus-per-task).
    lines.append(f"srun --ntasks={spec.nodes} --ntasks-per-node=1 --cpus-per-task={spec.cpus_per_task} "
                 f"bash -c {script_value('command', inner)}")
    return "\n".join(lines) + "\n"
