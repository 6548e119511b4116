"""The one typed way into scoring: :class:`ScoreJob`, built once from ``halsift score``'s settings, a recipe's
``score:`` section or a library call, and passed whole to the engine that runs it (:mod:`.engine`). Light to import."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

from halsift.filtering.scoring.guard import DEFAULT_MAX_PARSE_FAILURES
from halsift.filtering.scoring.settings import check_settings


@dataclass(frozen=True)
class ScoreJob:
    """Everything a scoring engine needs, typed, built once from the command's settings (``ScoreConfig``) or by
    library callers. ``detector``: a spec string, a spec file's path, or a loaded detector."""

    detector: Any
    data: str | os.PathLike
    out: str | os.PathLike
    unit: str = "sentence"
    batch_size: int = 64
    device: str | None = None
    decode_workers: int = 0  # input-pipeline processes per scoring process (0: one read-ahead thread)
    max_parse_failures: float = DEFAULT_MAX_PARSE_FAILURES
    show_progress: bool = True
    # tasks
    num_tasks: int | None = None
    task_index: int | None = None
    claim_timeout: float | None = None
    # ray
    address: str | None = None
    workers: int | None = None  # scoring actors

    embeddings: str | None = None  # a `halsift embed` folder that every CLIP-family detector reads
    full_hash: bool = False  # fingerprint input shards by their whole content (default: sampled blocks)

    def validate(self) -> None:
        """The job's own checks (:func:`check_settings`), one line naming the setting."""
        check_settings(unit=self.unit, data=self.data, batch_size=self.batch_size,
                       decode_workers=self.decode_workers, max_parse_failures=self.max_parse_failures)

    def settings(self) -> dict:
        """The settings that change what is scored, besides the detector and the inputs: compared when a folder is
        reused (:func:`halsift.corpus.run_folder.check_or_start`)."""
        return {"unit": self.unit}

    def run_settings(self) -> dict:
        """The settings that change only how the job runs (recorded in the manifest, never compared: changing them
        never rescores)."""
        return {"batch_size": self.batch_size, "decode_workers": self.decode_workers, "device": self.device,
                "max_parse_failures": self.max_parse_failures, "full_hash": self.full_hash}

    def given(self) -> set[str]:
        """The settings set away from their defaults (what an engine must honour or refuse)."""
        return given(self)

    def spec(self) -> Any:
        """The detector to build: ``detector``, with ``embeddings=`` given to every CLIP-family detector in it."""
        if not self.embeddings:
            return self.detector
        from halsift.filtering.detectors.embeddings_spec import with_embeddings

        return with_embeddings(self.detector, self.embeddings)


def given(job: Any) -> set[str]:
    """The fields of a job dataclass set away from their defaults."""
    return {f.name for f in dataclasses.fields(job) if getattr(job, f.name) != f.default}


__all__ = ["ScoreJob", "given"]
