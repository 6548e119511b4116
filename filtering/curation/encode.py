"""``dedup --model SPEC``: encode images on the fly with a CLIP-family detector's image encoder, into an embedding
store (:mod:`halsift.corpus.embedding_store`'s layout, ``DIR/embeddings``), so the rest reads it as it reads
``--embeddings`` (one code path: the two give equal results)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np

from halsift.corpus.embedding_store import (FORMAT, IMAGE, MANIFEST, embedding_table, part_paths,
                                            write_embedding_part)
from halsift.corpus.errors import InputError
from halsift.corpus.fingerprint import file_fingerprint, spec_fingerprint
from halsift.execution.run_folder import forget_part, part_done, part_reusable
from halsift.corpus.images import SkipCounter
from halsift.corpus.sample import read_shard
from halsift.corpus.scores import part_name
from halsift.corpus.shards import write_json_atomic

BATCH = 64


class ImageEncoder:
    """The image tower of a CLIP-family detector spec (``clip:...``): images -> L2-normalised float32 rows, batched
    as the detector scores them (:class:`~halsift.filtering.detectors.pixel_batch.PixelBatcher`: 8-bit pixels
    normalized in one step; with ``decode=gpu`` plain JPEGs decoded on the model's device). Images are what
    :attr:`image_arrays` asks the shard reader for; a row no decoder read is NaN."""

    def __init__(self, spec: str) -> None:
        from halsift.filtering.detectors.spec import load_detector

        det = load_detector(spec)
        if not (hasattr(det, "model") and hasattr(det.model, "encode_image") and hasattr(det, "preprocess")):
            raise InputError(f"--model {spec}: not a CLIP-family detector (expected one with an image encoder, "
                             "e.g. clip:arch=ViT-B-32,pretrained=openai)")
        self.spec, self.det = spec, det
        from halsift.filtering.detectors.pixel_batch import PixelBatcher

        self.pixels = getattr(det, "pixels", None) or PixelBatcher(det.preprocess)
        self.image_arrays = getattr(det, "image_arrays", False) if hasattr(det, "pixels") else False

    def __call__(self, images: list) -> np.ndarray:
        import torch

        out = []
        dtype = next(self.det.model.parameters()).dtype
        with torch.inference_mode():
            for b in range(0, len(images), BATCH):
                pix = self.pixels.finish(self.pixels(images[b:b + BATCH]), self.det.device, dtype)
                vec = torch.nn.functional.normalize(self.det.model.encode_image(pix).float(), dim=-1).cpu()
                vec[self.pixels.unreadable] = float("nan")
                out.append(vec)
        return torch.cat(out).numpy() if out else np.empty((0, 0), np.float32)


def encode_corpus(shards: Iterable[Path], folder: Path, encoder: ImageEncoder, bar=None) -> None:
    """Write one embedding part per shard into ``folder`` (:func:`encode_shard`), then its manifest."""
    folder.mkdir(parents=True, exist_ok=True)
    dim = None
    model_fp = spec_fingerprint(encoder.spec)  # the spec names the device, which decides decode=auto (gpu on CUDA)
    for shard in shards:
        dim = encode_shard(shard, folder, encoder, model_fp) or dim
        if bar is not None:
            bar.update()
    if dim is None:
        dim = _dim_of_parts(folder) or int(encoder([_blank()]).shape[1])
    write_json_atomic(folder / MANIFEST, {"format": FORMAT, "model": encoder.spec, "dim": int(dim),
                                          "dtype": "float16", "normalized": True, "complete": True})


def embedding_made_from(shard: Path, model_fp: str) -> dict:
    """What a shard's embedding part is made from: the shard's content fingerprint and the model's."""
    return {"source_fp": file_fingerprint(shard), "model_fp": model_fp}


def encode_shard(shard: Path, folder: Path, encoder: ImageEncoder, model_fp: str) -> int | None:
    """Write ``shard``'s embedding part into ``folder`` unless it is kept: a finished part is kept only when made
    from this content of its shard by this model and unaltered since (:mod:`halsift.execution.run_folder`); else it is
    made again (a part of an older folder, without a record, too). Returns the width of the vectors written now
    (``None`` when the part was kept or the shard has no valid image)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / part_name(0, str(shard))
    made = embedding_made_from(shard, model_fp)
    if part_reusable(folder, path.name, made):
        return None
    keys, images = [], []
    for s in read_shard(shard, SkipCounter(), arrays=encoder.image_arrays):
        keys.append(s.key)
        images.append(s.image)
    vecs = encoder(images) if images else None
    forget_part(folder, path.name)
    path.unlink(missing_ok=True)
    if vecs is None:
        return None
    ok = np.isfinite(vecs).all(1)  # images no decoder read are left out, as a skipped sample is
    keys, vecs = [k for k, good in zip(keys, ok) if good], vecs[ok]
    write_embedding_part(embedding_table(keys, [IMAGE] * len(keys), vecs), path, {"shard": str(shard), **made})
    part_done(folder, path.name, made)
    return int(vecs.shape[1])


_ENCODERS: dict[str, ImageEncoder] = {}


def cached_encoder(spec: str) -> ImageEncoder:
    """One :class:`ImageEncoder` per spec and process (a worker making several parts loads the model once)."""
    if spec not in _ENCODERS:
        _ENCODERS[spec] = ImageEncoder(spec)
    return _ENCODERS[spec]


def _dim_of_parts(folder: Path) -> int | None:
    import pyarrow.parquet as pq

    for p in part_paths(folder):
        return pq.read_schema(p).field("embedding").type.list_size
    return None


def _blank():
    from PIL import Image

    return Image.new("RGB", (32, 32))
