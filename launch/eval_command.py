"""``halsift eval NAME`` for every evaluation of :data:`halsift.eval.registry.EVALS`: the flags come from the
eval's config class (one ``--flag`` per setting, ``--config YAML`` for all of them), the command calls the library
function, and :func:`run_eval` wires the synthetic world in where a config asks for it (``synthetic``) -- the one
place outside ``halsift.synth`` that knows the world's answerers, for the commands and the recipes alike."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping


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


def run_eval(name: str, config):
    """Run evaluation ``name`` with ``config``: the library function, fed the synthetic world's data when
    ``config.synthetic`` is set. Returns its :class:`~halsift.eval.result.EvalResult`."""
    from halsift.eval.registry import EVALS

    entry = EVALS[name]
    data = synthetic_data(name, config) if getattr(config, "synthetic", False) else None
    return entry.run(config) if data is None else entry.run(config, data)


def eval_command(name: str, metavars: Mapping[str, str] | None = None) -> tuple[str, Callable, Callable]:
    """``(HELP, add_arguments, run)`` of the ``halsift eval NAME`` command module."""
    from halsift.eval.registry import EVALS
    from halsift.launch.describe import config_arguments

    cls = EVALS[name].config
    # list flags add up over repeats (`--scores A --scores B`); bench's --describe lists the detector families too
    add_arguments = config_arguments(cls, metavars, detectors=name == "bench")

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

    return EVALS[name].help, add_arguments, run
