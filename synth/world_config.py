"""What a synthetic world is made of: one set of settings for ``halsift synth``'s flags and a recipe's ``world``
section (both pass them to :func:`halsift.synth.world.generate_world`). Imports nothing heavy, so recipe
validation stays fast."""

from __future__ import annotations

from dataclasses import dataclass

from halsift.corpus.config import field
from halsift.synth.styles import RETRIEVAL_STYLES


def check_corpus_sentences(window) -> tuple[int, int] | None:
    """``corpus_sentences`` as ``(lo, hi)`` (None when empty: whole captions), or ValueError naming the key."""
    w = tuple(window)
    if w and (len(w) != 2 or not 1 <= w[0] <= w[1]):
        raise ValueError(f"corpus_sentences: expected [lo, hi] with 1 <= lo <= hi, got {list(w)}")
    return w or None


@dataclass
class WorldSettings:
    """The synthetic world's sizes and makers (a world is a function of these and the seed)."""

    images: int = field(2000, range="[1, inf)", help="corpus image-caption pairs")
    image_size: int = field(64, range="[32, inf)", help="image side in pixels (>= 32)")
    bench_images: int | None = field(None, range="[0, inf)",
                                     help="bench images, each captioned by all 6 captioners (default "
                                          "max(24, images/4))")
    t2i_prompts: int | None = field(None, range="[0, inf)", help="t2i prompts, each drawn by all 3 generators (default "
                                                                 "max(12, bench_images/2))")
    retrieval_images: int | None = field(None, range="[0, inf)",
                                         help="held-out retrieval images with 5 captions each (default "
                                              "max(20, images/10))")
    pretrain_images: int | None = field(None, range="[0, inf)",
                                        help="pre-training pairs: web alt-text + a clean detailed caption "
                                             "(default images)")
    shard_size: int = field(256, range="[1, inf)", help="samples per shard")
    captioners: list[str] = field(default_factory=list, help="simulated captioners that write the corpus (default: "
                                                             "all six; HalDec Table F's corpus is one captioner's)",
                                  cli={"metavar": "NAME"})
    corpus_sentences: list[int] = field(default_factory=list, help="[lo, hi]: each corpus caption is lo-hi "
                                        "consecutive sentences of the captioner's caption, starting anywhere (short "
                                        "captions that fit CLIP's context); default: whole captions",
                                        cli={"metavar": "N"})
    retrieval_style: str = field("captioners", help="retrieval captions: 2-3 sentences by the captioners that do not "
                                                    "write the corpus (default), or short human-style captions over "
                                                    "families of look-alike scenes",
                                 cli={"choices": RETRIEVAL_STYLES})
    zeroshot_images: int | None = field(None, range="[0, inf)",
                                        help="images per zero-shot task (shape, colour, count of the main "
                                             "object; CLIP_benchmark wds layout in zeroshot/TASK); 0 = none "
                                             "(default max(12, images/30))")
    compositional_images: int | None = field(None, range="[0, inf)",
                                             help="images with SugarCrepe's seven hard-negative categories "
                                                  "(compositional/); 0 = none (default max(12, images/30))")
    leaks: float = field(0.0, range="[0, 1]",
                         help="planted evaluation leaks: the share (0-1) of retrieval images with a near copy "
                              "(cropped <= 10%, resized, colour-jittered, JPEG re-encoded) put into the corpus, "
                              "captioned by the corpus captioner; world.json 'leaks' records them")
    exact_copies: int = field(0, range="[0, inf)",
                              help="planted byte-identical copies of corpus samples (new keys); world.json "
                                   "'exact_copies' records them")

    def validate(self) -> None:
        from halsift.synth.captioners import check_captioner_names

        if self.retrieval_style not in RETRIEVAL_STYLES:  # the sizes' ranges are declared on the fields
            raise ValueError(f"retrieval_style: expected one of {RETRIEVAL_STYLES}, got {self.retrieval_style!r}")
        check_captioner_names(self.captioners, "captioners")
        check_corpus_sentences(self.corpus_sentences)

    def generator_kwargs(self) -> dict:
        """These settings as :func:`~halsift.synth.world.generate_world` keyword arguments."""
        return {f: getattr(self, f) for f in WorldSettings.__dataclass_fields__}
