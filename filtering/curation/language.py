"""Caption language identification without a download: lingua (its models ship in the wheel), or fastText's
``lid.176.bin`` when the user gives that file.

lingua is built once per run. Restricting it to the languages a corpus can hold (``languages``) is the big
speed-up. Measured on this machine (2 cores shared with other jobs; the two numbers are two runs at different
load), 2000 short captions in en/de/fr/es, one setting per process (``python -m
halsift.filtering.curation.language all|low|four``): every language: the first call loads its models in 37-55 s,
peak RSS 1065 MB, then 182-269 captions/s; every language in low-accuracy mode: 2.3 s, 85 MB, 667-2077/s; four
languages (en, de, fr, es): 7.5 s, 195 MB, 3037-6100/s. A caption whose language is outside a restricted set is
reported as the closest one in the set, so restrict only when the corpus is known to hold those languages.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from halsift.corpus.errors import InputError

MISSING = ("language detection needs lingua-language-detector: pip install 'halsift[curate]' "
           "(or give a fastText lid.176.bin with --lid-model)")
UNKNOWN = ""  # lang of a caption with no letters to go by


class LanguageError(InputError):
    """A language detector that cannot be built (package missing, bad language code, unreadable model file)."""


class LanguageDetector:
    """``detect(texts) -> [(iso 639-1 code or '', confidence 0-1)]``, built once."""

    name = "lingua"

    def __init__(self, languages: Sequence[str] = (), low_accuracy: bool = False) -> None:
        try:
            from lingua import IsoCode639_1, LanguageDetectorBuilder
        except ImportError:
            raise LanguageError(MISSING) from None
        if languages:
            codes = []
            for code in languages:
                try:
                    codes.append(getattr(IsoCode639_1, code.strip().upper()))
                except AttributeError:
                    raise LanguageError(f"languages: {code!r} is not an ISO 639-1 code lingua knows "
                                        "(e.g. en, de, fr, es)") from None
            if len(codes) < 2:
                raise LanguageError("languages: give at least two codes (lingua needs a choice), e.g. en,de")
            builder = LanguageDetectorBuilder.from_iso_codes_639_1(*codes)
        else:
            builder = LanguageDetectorBuilder.from_all_languages()
        if low_accuracy:
            builder = builder.with_low_accuracy_mode()
        self.detector = builder.build()
        self.settings = {"detector": "lingua", "languages": sorted(c.lower() for c in languages),
                         "low_accuracy": low_accuracy}

    def __reduce__(self):  # rebuilt from its settings in another process (basic's parts on Ray)
        return LanguageDetector, (self.settings["languages"], self.settings["low_accuracy"])

    def detect(self, texts: Sequence[str]) -> list[tuple[str, float]]:
        out = []
        for values in self.detector.compute_language_confidence_values_in_parallel(list(texts)):
            top = values[0] if values else None
            if top is None or top.value <= 0:
                out.append((UNKNOWN, 0.0))
            else:
                out.append((top.language.iso_code_639_1.name.lower(), float(top.value)))
        return out


class FastTextDetector:
    """fastText's language id model (``lid.176.bin``, given by the user; fasttext imported only here)."""

    name = "fasttext"

    def __init__(self, model: str) -> None:
        path = Path(model)
        if not path.is_file():
            raise LanguageError(f"lid_model: {path} is not a file (expected fastText's lid.176.bin)")
        try:
            import fasttext
        except ImportError:
            raise LanguageError("lid_model: needs the fasttext package (pip install fasttext)") from None
        try:
            self.model = fasttext.load_model(str(path))
        except ValueError as e:
            raise LanguageError(f"lid_model: {path} is not a fastText model ({e})") from None
        self.settings = {"detector": "fasttext", "model": str(path.resolve())}

    def __reduce__(self):  # rebuilt from its model file in another process (basic's parts on Ray)
        return FastTextDetector, (self.settings["model"],)

    def detect(self, texts: Sequence[str]) -> list[tuple[str, float]]:
        labels, probs = self.model.predict([re.sub(r"\s+", " ", t) for t in texts], k=1)
        return [((lab[0].removeprefix("__label__") if lab else UNKNOWN), float(p[0]) if len(p) else 0.0)
                for lab, p in zip(labels, probs)]


def make_detector(languages: Sequence[str] = (), low_accuracy: bool = False,
                  lid_model: str | None = None) -> LanguageDetector | FastTextDetector:
    """fastText when ``lid_model`` is given, else lingua (raises :class:`LanguageError` naming what is missing)."""
    return FastTextDetector(lid_model) if lid_model else LanguageDetector(languages, low_accuracy)


def _benchmark(setting: str, n: int = 2000) -> None:
    """First-call seconds, captions per second and peak RSS of one lingua setting (the module docstring's numbers;
    one setting per process: lingua's loaded models are shared by every detector of a process)."""
    import resource
    import time

    texts = ["A red dog on the grass next to a blue car.", "Ein roter Hund auf dem Gras neben einem blauen Auto.",
             "Un chien rouge sur l'herbe à côté d'une voiture.", "Un perro rojo en la hierba junto a un coche."]
    texts = (texts * (n // len(texts) + 1))[:n]
    kw = {"all": {}, "low": {"low_accuracy": True}, "four": {"languages": ["en", "de", "fr", "es"]}}[setting]
    t = time.perf_counter()
    d = LanguageDetector(**kw)
    d.detect(texts[:8])  # models load on first use
    load = time.perf_counter() - t
    t = time.perf_counter()
    d.detect(texts)
    rate = n / (time.perf_counter() - t)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{setting}: first call {load:.1f} s, then {rate:.0f} captions/s, peak RSS {rss:.0f} MB")


if __name__ == "__main__":
    import sys

    _benchmark(sys.argv[1] if len(sys.argv) > 1 else "four")
