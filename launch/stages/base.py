"""What every recipe stage receives: the run's :class:`Paths`, resolved once from the recipe."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from halsift.corpus.safe_paths import safe_component

if TYPE_CHECKING:
    from halsift.launch.recipe_config import Recipe


@dataclass
class Paths:
    """Where each stage reads and writes, resolved once from the recipe."""

    run: Path
    corpus: str
    bench: str
    retrieval: dict[str, str]
    pretrain_data: str
    base: str  # base CLIP weights (pretrained tag or file), '' until the pretrain stage has run

    def stage(self, name: str) -> Path:
        return self.run / name

    def named(self, stage: str, name: str) -> Path:
        """``<run>/<stage>/<name>`` for a recipe name (a detector, ensemble, variant): refused unless ``name`` is one
        safe path component, so no recipe builds a path outside the run folder (the config checks it first)."""
        return self.stage(stage) / safe_component(name, stage)


def resolve_paths(r: Recipe) -> Paths:
    run = Path(r.run_dir)
    world = run / "world"
    corpus = r.data.corpus or (str(world / "corpus") if r.world.enabled else "")
    bench = r.data.bench or (str(world / "bench" / "bench.jsonl") if r.world.enabled else "")
    retrieval = dict(r.data.retrieval) or ({"synthetic": str(world / "retrieval")} if r.world.enabled else {})
    pretrain = r.data.pretrain or (str(world / "pretrain") if r.world.enabled else "")
    base = r.model.pretrained or str(run / "pretrain" / "final" / "open_clip_model.safetensors")
    return Paths(run, corpus, bench, retrieval, pretrain, base)
