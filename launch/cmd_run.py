"""``halsift run RECIPE [key=value ...]``: run a recipe's stages in order, resuming where it stopped."""

from __future__ import annotations

import argparse
import builtins
import sys
from dataclasses import dataclass
from pathlib import Path

from halsift.corpus.config import add_dataclass_arguments, field

HELP = "run a YAML recipe (synth -> pretrain -> score -> select -> finetune -> eval -> report); reruns resume"
INTERMIXED = "overrides"  # key=value words anywhere after the recipe, also after --dry-run / --force STAGE


@dataclass
class RunFlags:
    """``halsift run``'s own flags; the recipe's settings are the sections below (``halsift run --describe``)."""

    recipe: str | None = field(None, help="recipe YAML path, or the name of a shipped recipe (e.g. quickstart)",
                               cli={"positional": True, "nargs": "?"})
    overrides: builtins.list[str] = field(default_factory=list, help="override recipe fields (dotted keys, key=value); anywhere after "
                                                   "the recipe", cli={"positional": True, "nargs": "*",
                                                                      "metavar": "key=value"})
    dry_run: bool = field(False, help="resolve and check the recipe, load no model, run nothing")
    force: builtins.list[str] = field(default_factory=list, help="make this stage again from scratch (its folder "
                                                                "emptied), even if complete (repeat for several)",
                                      cli={"append": True, "metavar": "STAGE"})
    list: bool = field(False, help="list the shipped recipes")


CONFIG = RunFlags  # the settings (docs/config.md; --describe prints them after the recipe's)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from halsift.launch.describe import add_describe_argument

    add_dataclass_arguments(p, RunFlags, config_file=False, defaults=True)
    add_describe_argument(p, "halsift.launch.recipe_config:Recipe", detectors=True, more=(RunFlags,))


def shipped_recipes() -> dict[str, Path]:
    """Name -> path of the YAML recipes installed with halsift (found recursively)."""
    import halsift.recipes as pkg

    root = Path(pkg.__file__).parent
    return {str(p.relative_to(root).with_suffix("")): p for p in sorted(root.rglob("*.yaml"))
            if not p.name.startswith("_")}


def resolve_recipe_path(name: str) -> Path:
    path = Path(name)
    if path.exists():
        return path
    shipped = shipped_recipes()
    if name in shipped:
        return shipped[name]
    raise FileNotFoundError(f"recipe: {name} is neither a file nor a shipped recipe ({', '.join(shipped)})")


def load_recipe(name: str, overrides: list[str]):
    """Read a recipe file, apply ``key=value`` overrides and validate (errors name the key)."""
    from halsift.corpus.config import deep_merge, from_dict, load_yaml, parse_overrides
    from halsift.launch.recipe_config import Recipe

    data = deep_merge(load_yaml(resolve_recipe_path(name), empty_ok=False), parse_overrides(overrides))
    return from_dict(Recipe, data)


def run(args: argparse.Namespace) -> int:
    from halsift.launch.cli import UsageError

    if args.list:
        for name, path in shipped_recipes().items():
            print(f"{name}\t{path}")
        return 0
    if not args.recipe:
        raise UsageError("RECIPE: give a recipe path or a shipped recipe name (see --list)")
    from halsift.launch.recipe_config import STAGES

    unknown = [s for s in args.force if s not in STAGES]
    if unknown:
        raise UsageError(f"--force: unknown stage {unknown[0]!r}; expected one of {', '.join(STAGES)}")
    recipe = load_recipe(args.recipe, args.overrides)
    from halsift.launch.recipe import run_recipe
    from halsift.launch.recipe_ranks import RankWaitError, ranks_from_env

    try:
        report = run_recipe(recipe, dry_run=args.dry_run, force=tuple(args.force))
    except RankWaitError as e:  # a rank > 0 gave up on rank 0: one line, not a traceback
        print(f"halsift run: error: {e}", file=sys.stderr)
        return 1
    if args.dry_run:
        print(f"recipe {args.recipe}: ok (stages: {', '.join(recipe.stages)}; run folder {recipe.run_dir})")
    elif getattr(ranks_from_env(), "is_main", True):  # rank > 0 said what it did
        print(f"report: {report / 'report.md'}")
    return 0
