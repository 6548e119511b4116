"""The ``halsift`` command line.

Each (sub)command lives in its own module ``halsift.launch.cmd_*`` exposing ``HELP`` (one line),
``add_arguments(parser)`` and ``run(args) -> int``, or is generated with the same attributes (``halsift eval NAME``
from the evaluations registry: ``launch/eval_command.py``). Command modules import only argparse-level things at the
top; torch, transformers and open_clip are imported inside ``run``, so ``halsift --help`` is instant.

Exit codes: 0 on success; 2 with a one-line message naming the bad flag/key/file on a usage or config error, an
unreadable or unwritable path (any ``OSError``: missing, read-only, a full disk) or a corrupt file (parquet,
safetensors), with no traceback; 1 on an unexpected failure; 130 on Ctrl-C (SIGINT) and 143 on SIGTERM, each with
one line naming the command and what it kept (:data:`KEPT`). SIGTERM is raised in the command as
:class:`Terminated`, a ``KeyboardInterrupt``, so it unwinds through the same clean-up as Ctrl-C.

A command module may name a list positional ``INTERMIXED`` (``run``: its ``key=value`` overrides): words left
over after the flags are appended to it, so ``halsift run RECIPE --dry-run key=value`` works.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

GENERATED = "*"
# command path -> module; a module that does not exist yet is simply not offered. A path ending in GENERATED is a
# group of commands its module builds (``commands() -> {name: command}``, each with a module's HELP, add_arguments,
# run, CONFIG): ``halsift eval NAME``, from the evaluations registry.
COMMANDS: dict[tuple[str, ...], str] = {
    ("synth",): "halsift.launch.cmd_synth",
    ("stats",): "halsift.launch.cmd_stats",
    ("convert",): "halsift.launch.cmd_convert",
    ("export",): "halsift.launch.cmd_export",
    ("score",): "halsift.launch.cmd_score",
    ("embed",): "halsift.launch.cmd_embed",
    ("select",): "halsift.launch.cmd_select",
    ("basic",): "halsift.launch.cmd_basic",
    ("annotate",): "halsift.launch.cmd_annotate",
    ("dedup",): "halsift.launch.cmd_dedup",
    ("train", "clip"): "halsift.launch.cmd_train_clip",
    ("train", "detector"): "halsift.launch.cmd_train_detector",
    ("eval", GENERATED): "halsift.launch.eval_command",  # one per evaluation of halsift.eval.registry.EVALS
    ("run",): "halsift.launch.cmd_run",
    ("launch",): "halsift.launch.cmd_launch",
}
GROUP_HELP = {
    "train": "train a CLIP model on shards or a detector on an annotated bench",
    "eval": "evaluate: detection benchmark, retrieval, zero-shot, compositional, I-HallA, VOPE, VIGIL",
}


class UsageError(Exception):
    """A bad flag, key, value or path given by the user: reported in one line, exit code 2."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``scancel``, a launcher stopping its ranks), raised in the main thread like Ctrl-C."""


# what an interrupted command leaves behind ({out}: its --out); others: files are written atomically
KEPT = {
    "score": "the finished parts in {out} are kept; the same command resumes",
    "select": "with --resumable the finished shards in {out} are kept and the same command resumes; without it "
              "the partial selection was removed",
    "run": "completed stages and finished parts in the run folder are kept; the same command resumes",
    "train clip": "complete checkpoints in {out}/checkpoints are kept; add --resume to continue from the newest",
    "train detector": "complete checkpoints in {out}/checkpoints are kept; add --resume to continue from the newest",
    "launch": "the signal was passed on to the launched command",
}
KEPT_DEFAULT = "no half-written file is left (files are written atomically); run the command again"
EXIT_SIGNAL = {"SIGINT": 130, "SIGTERM": 143}


def interrupted(args: argparse.Namespace, signame: str) -> int:
    """Print the one line of an interrupted command (which, by what signal, what it kept); the exit code."""
    out = getattr(args, "out", None) or "--out"
    kept = KEPT.get(args._name, KEPT_DEFAULT).format(out=out)
    print(f"halsift {args._name}: stopped by {signame}; {kept}", file=sys.stderr, flush=True)
    return EXIT_SIGNAL[signame]


def _raise_terminated(pid: int):
    """The SIGTERM handler of process ``pid``: raise :class:`Terminated` there (once: a second SIGTERM ends it at
    once); in a forked child (a data-loading worker) SIGTERM keeps its default meaning."""
    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if os.getpid() != pid:
            os.kill(os.getpid(), signal.SIGTERM)
            return
        raise Terminated()

    return handler


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean 'the input is wrong', reported without a traceback."""
    from halsift.corpus.errors import InputError

    return (UsageError, FileNotFoundError, NotADirectoryError, FileExistsError, InputError)


def _format_errors() -> tuple[type[BaseException], ...]:
    """Errors of the file-format libraries: a corrupt parquet, a garbage safetensors file."""
    errs: list[type[BaseException]] = []
    for mod, name in (("pyarrow.lib", "ArrowInvalid"), ("safetensors", "SafetensorError")):
        try:
            errs.append(getattr(importlib.import_module(mod), name))
        except (ImportError, AttributeError):
            pass
    return tuple(errs)


def one_line(e: BaseException, limit: int = 500) -> str:
    """The message of ``e`` as one line: an OSError names its path; an error re-raised from a DataLoader worker
    ("Caught X in DataLoader worker process N." + traceback) gives the original error's last line."""
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        msg = f"{e.filename}: {e.strerror}"
    else:
        text = str(e)
        lines = [ln for ln in text.splitlines() if ln.strip()]
        if lines and lines[0].startswith("Caught ") and "Original Traceback" in text:
            msg = lines[-1].split(": ", 1)[-1]
        else:
            msg = lines[0] if lines else type(e).__name__
    if isinstance(e, _format_errors()) and not isinstance(e, OSError):
        msg = f"{type(e).__name__}: {msg}"
    return msg if len(msg) <= limit else msg[:limit] + "..."


UNLOCKED = ("launch", "run")  # launch: its ranks take the lock; run: a recipe has no --out


def _shares_out(args) -> bool:
    """``score``/``select``/``embed``/``basic``/``dedup`` as one of several tasks (``--num-tasks``, or a SLURM array task): the tasks share one
    ``--out`` on purpose and coordinate through per-part claims (:mod:`halsift.execution.claims`), not the lock."""
    if args._name not in ("score", "select", "embed", "basic", "dedup"):
        return False
    from halsift.execution.claims import TaskError, task_from_env

    try:
        return task_from_env(getattr(args, "num_tasks", None), getattr(args, "task_index", None)) is not None
    except TaskError:  # the command itself reports it, in one line
        return False
ERROR_FILE_ENV = "HALSIFT_ERROR_FILE"  # set by `halsift launch`: ranks append their one-line user error here


def _user_error(line: str) -> int:
    """Print the one-line error (and hand it to a `halsift launch` parent, which then exits 2 with it)."""
    print(line, file=sys.stderr)
    path = os.environ.get(ERROR_FILE_ENV)
    if path:
        try:
            with open(path, "a", encoding="utf-8") as f:
                f.write(line + "\n")
        except OSError:
            pass
    return 2


def _load(module: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            return None
        raise


def commands() -> dict[tuple[str, ...], Any]:
    """Every command by path, in :data:`COMMANDS` order: its module, or a generated command (built now, so an
    evaluation registered before the parser is built is a command)."""
    table = {}
    for path, module in COMMANDS.items():
        mod = _load(module)
        if mod is None:
            continue
        if path[-1] == GENERATED:
            table |= {(*path[:-1], name): cmd for name, cmd in mod.commands().items()}
        else:
            table[path] = mod
    return table


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="halsift",
        description="Curate image-caption data with hallucination detectors: synth, score, select, train, eval.")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    groups: dict[str, argparse._SubParsersAction] = {}
    for path, mod in commands().items():
        if len(path) == 1:
            p = sub.add_parser(path[0], help=mod.HELP, description=mod.HELP)
        else:
            group, leaf = path
            if group not in groups:
                gp = sub.add_parser(group, help=GROUP_HELP.get(group, ""), description=GROUP_HELP.get(group, ""))
                groups[group] = gp.add_subparsers(dest="subcommand", metavar="<subcommand>")
                gp.set_defaults(_group_parser=gp)
            p = groups[group].add_parser(leaf, help=mod.HELP, description=mod.HELP)
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run, _name=" ".join(path), _intermixed=getattr(mod, "INTERMIXED", None))
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``parser.parse_args``, except that a command's ``INTERMIXED`` list also takes the words left after its flags."""
    args, extra = parser.parse_known_args(argv)
    dest = getattr(args, "_intermixed", None)
    if extra and (dest is None or any(a.startswith("-") for a in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        setattr(args, dest, [*getattr(args, dest), *extra])
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``halsift <command> ...``; returns the exit code (also usable from tests)."""
    parser = build_parser()
    args = _parse(parser, list(argv) if argv is not None else None)
    if getattr(args, "_run", None) is None:
        (getattr(args, "_group_parser", None) or parser).print_help()
        return 2
    from halsift.launch.output_lock import OutputBusyError, output_lock

    out = getattr(args, "out", None)
    previous = _set_sigterm(_raise_terminated(os.getpid()))
    try:
        with output_lock(out if isinstance(out, str) and args._name not in UNLOCKED and not _shares_out(args)
                         else None, args._name):
            return int(args._run(args) or 0)
    except (*_user_errors(), OutputBusyError, OSError, *_format_errors()) as e:  # bad input, unreadable/unwritable paths, corrupt files
        return _user_error(f"halsift {args._name}: error: {one_line(e)}")
    except Terminated:
        return interrupted(args, "SIGTERM")
    except KeyboardInterrupt:
        return interrupted(args, "SIGINT")
    finally:
        _set_sigterm(previous)
        _leave_group()


def _leave_group() -> None:
    """End the process group a ranked command joined (torchrun/srun), before the interpreter exits: a gloo group left
    open aborts a rank at exit now and then (``terminate called without an active exception``, exit -6), which fails
    a job whose work is all done. Nothing to do where torch.distributed was never imported."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return
    from halsift.launch.recipe_ranks import leave_group

    leave_group()


def _set_sigterm(handler):
    """Install ``handler`` for SIGTERM and return the previous one (nothing outside the main thread, where Python
    delivers signals; ``None`` in, ``None`` out)."""
    import threading

    if handler is None or threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handler)


if __name__ == "__main__":  # `python -m halsift.launch.cli` (sbatch scripts): run the imported module's main, so
    # that UsageError raised by the commands is the class main catches (not a second copy in __main__)
    from halsift.launch.cli import main as _main

    sys.exit(_main())
