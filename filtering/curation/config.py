"""``halsift dedup``'s settings (:class:`DedupConfig`): the command's flags, ``--describe``, docs/config.md and the
recipe's ``dedup:`` section."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from halsift.corpus.config import field
from halsift.execution.flags import EngineFlags


_T = {"group": "thresholds (defaults measured on the synthetic world: docs/curation.md)"}


@dataclass
class DedupConfig(EngineFlags):
    """``halsift dedup``'s settings: every flag, ``--describe`` and docs/config.md come from this class."""

    data: str = field("", help="corpus shards (folder / glob / brace pattern)", cli={"required": True})
    out: str = field("", help="folder: duplicates.parquet + manifest.json (+ _parts/ per shard: rerun the same "
                              "command to resume)", cli={"required": True})
    against: list[str] = field(default_factory=list, help="evaluation image sets whose near-duplicates in the "
                               "corpus are leaks: retrieval.jsonl, bench.jsonl, a CLIP_benchmark wds folder, shards "
                               "or an image folder (repeatable)", cli={"metavar": "PATH"})
    embeddings: str | None = field(None, help="an embeddings folder (`halsift embed`): adds semantic "
                                              "near-duplicates by cosine", cli={"exclusive": "semantic"})
    model: str | None = field(None, help="a CLIP-family detector spec: encode images on the fly (into "
                                         "OUT/embeddings) for semantic near-duplicates",
                              cli={"exclusive": "semantic", "metavar": "SPEC"})
    exact_on: Literal["image", "pair", "caption"] = field(
        "image", help="exact duplicates share the image bytes (image), image bytes and normalized caption (pair), "
                      "or the normalized caption (caption)")
    phash_distance: int = field(4, range="[0, 32]",
                                help="near duplicates: phash Hamming distance at most this (of 64 bits) ...",
                                cli=_T)
    near_thumbnail: float = field(0.97, range="[-1, 1]", help="... and thumbnail cosine at least this", cli=_T)
    eval_thumbnail: float = field(0.92, range="[-1, 1]",
                                  help="leaks: thumbnail cosine to a crop variant of an --against image at "
                                       "least this", cli=_T)
    cosine: float = field(0.95, range="[-1, 1]",
                          help="with embeddings: near duplicates and leaks at cosine at least this", cli=_T)
    nprobe: int = field(8, range="[1, inf)",
                        help="with embeddings: k-means cells searched per vector (more: higher recall, slower)",
                        cli=_T)
    allow_implausible: bool = field(False, help="write the result even when more than half of the corpus is "
                                                "listed as leaks or as duplicates (refused otherwise)")
    no_progress: bool = field(False, help="no progress bars")


__all__ = ["DedupConfig"]
