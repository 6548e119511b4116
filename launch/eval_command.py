"""``halsift eval NAME`` for every evaluation of :data:`halsift.eval.registry.EVALS`, generated here from its entry
(the CLI's command table names this module for the ``eval`` group): the flags come from the eval's config class
(one ``--flag`` per setting, ``--config YAML`` for all of them), the command calls the library function, and
:func:`run_eval` wires the synthetic world in where a config asks for it (``synthetic``) -- the one place outside
``halsift.synth`` that knows the world's answerers, for the commands and the recipes alike."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A generated command: what a ``cmd_*`` module holds (``HELP``, ``add_arguments``, ``run``, ``CONFIG``)."""

    HELP: str  # one line
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    CONFIG: type  # the settings (docs/config.md, --describe)


def synthetic_data(name: str, config):
    """The synthetic world's data for evaluation ``name`` under ``config`` (None for an eval without one)."""
    if name == "ihalla":
        from halsift.synth.ihalla import synthetic_answers as build
    elif name == "vope":
        from halsift.synth.vope import synthetic_records as build
    elif name == "vigil":
        from halsift.synth.vigil import synthetic_inputs as build
    else:
        return None
    return build(config)


def run_eval(name: str, config, data=None):
    """Run evaluation ``name`` with ``config``: the library function, given ``data`` (what the caller already holds,
    e.g. a recipe's score tables), else the synthetic world's when ``config.synthetic`` is set. Returns its
    :class:`~halsift.eval.result.EvalResult`."""
    from halsift.eval.registry import EVALS

    entry = EVALS[name]
    if data is None and getattr(config, "synthetic", False):
        data = synthetic_data(name, config)
    return entry.run(config) if data is None else entry.run(config, data)


def command(name: str) -> Command:
    """The ``halsift eval NAME`` command of registry entry ``name``."""
    from halsift.eval.registry import EVALS
    from halsift.launch.describe import config_arguments

    entry = EVALS[name]
    cls = entry.config

    def run(args: argparse.Namespace) -> int:
        from halsift.corpus.config import ConfigError, config_from_args, flag_message
        from halsift.launch.cli import UsageError

        try:  # a setting the library refuses while running (e.g. a missing vocabulary) is named as its flag too
            result = run_eval(name, config_from_args(cls, args))
        except ConfigError as e:
            raise UsageError(flag_message(str(e))) from None
        if result.summary:
            print(result.summary)
        return 0

    # list flags add up over repeats (`--scores A --scores B`)
    return Command(entry.help, config_arguments(cls, dict(entry.metavars), detectors=entry.detector_specs), run, cls)


def commands() -> dict[str, Command]:
    """``halsift eval NAME`` for every evaluation the registry holds now, in its order."""
    from halsift.eval.registry import EVALS

    return {name: command(name) for name in EVALS}
