"""Tiny labelled shards and bench files for the filtering tests (until/besides the synthetic world)."""

from __future__ import annotations

import io
import random
from pathlib import Path

from PIL import Image

from halsift.corpus.bench import write_bench
from halsift.corpus.shards import Sample, ShardWriter

CAPTIONERS = ("capA", "capB", "capC")
WORDS = ("dog", "cat", "red", "tree", "car", "blue", "house", "two", "bird", "sky")


def png(rng: random.Random, size: int = 32) -> bytes:
    img = Image.new("RGB", (size, size), tuple(rng.randrange(256) for _ in range(3)))
    img.putpixel((rng.randrange(size), rng.randrange(size)), (0, 0, 0))
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def sentences(rng: random.Random, n: int) -> list[dict]:
    out = []
    for i in range(n):
        text = "A " + " ".join(rng.choice(WORDS) for _ in range(4)) + f" number {i}."
        label = rng.choices(("correct", "incorrect", "unknown"), (0.65, 0.3, 0.05))[0]
        out.append({"text": text, "position": i, "label": label,
                    "types": ["Object"] if label == "incorrect" else [], "spans": [[1, 2]] if label == "incorrect" else []})
    return out


def make_corpus(out: Path, shards: int = 4, per_shard: int = 6, seed: int = 0, corrupt: dict | None = None) -> Path:
    """Write ``shards`` x ``per_shard`` samples; ``corrupt`` maps key -> "image" | "caption" to break samples."""
    rng = random.Random(seed)
    corrupt = corrupt or {}
    with ShardWriter(out, maxcount=per_shard) as w:
        for i in range(shards * per_shard):
            key = f"s{seed}_{i:05d}"
            sents = sentences(rng, rng.randint(1, 4))
            caption = " ".join(s["text"] for s in sents)
            image = png(rng)
            if corrupt.get(key) == "image":
                image = image[:40]  # truncated PNG
            if corrupt.get(key) == "caption":
                caption, sents = "", []
            w.write(Sample(key=key, image=image, caption=caption, ext="png",
                           meta={"captioner": CAPTIONERS[i % 3], "source": "i2t", "image_id": f"img{i}",
                                 "sentences": sents}))
    return out


def make_bench(out: Path, captions: int = 8, seed: int = 0) -> Path:
    rng = random.Random(seed)
    (out / "images").mkdir(parents=True, exist_ok=True)
    rows = []
    for c in range(captions):
        (out / "images" / f"im{c}.png").write_bytes(png(rng))
        sents = [s for s in sentences(rng, rng.randint(1, 3))]
        caption = " ".join(s["text"] for s in sents)
        for s in sents:
            rows.append({"id": f"c{c}_p{s['position']}", "image": f"images/im{c}.png", "image_id": f"im{c}",
                         "generator": CAPTIONERS[c % 3], "generator_type": "i2t", "domain": "synthetic",
                         "caption_id": f"c{c}", "position": s["position"], "sentence": s["text"],
                         "caption": caption, "label": s["label"], "types": s["types"], "spans": s["spans"],
                         "split": "test"})
    write_bench(out / "bench.jsonl", rows)
    return out / "bench.jsonl"


def reshard(src: Path, dst: Path, maxcount: int) -> Path:
    """Copy the samples of shard folder ``src`` into ``dst`` with ``maxcount`` samples per shard."""
    from halsift.corpus.shards import iter_samples

    with ShardWriter(dst, maxcount=maxcount) as w:
        for s in iter_samples(src):
            w.write(Sample(s.key, s.image, s.caption, {k: v for k, v in s.meta.items() if k != "key"}, s.ext))
    return dst


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scored_corpus(out: Path, shards: int, per_shard: int, seed: int, spec: str = "random:seed=1") -> tuple[Path, Path]:
    """A corpus (:func:`make_corpus`) and its score folder under ``out``: ``(corpus, scores)``."""
    from halsift.filtering.scoring.runner import score

    corpus = make_corpus(out / "corpus", shards=shards, per_shard=per_shard, seed=seed)
    score(spec, corpus, out / "scores", batch_size=8, show_progress=False)
    return corpus, out / "scores"


def judge_and_clip(d: Path) -> Path:
    """24 samples in 4 shards under ``d/corpus``, scored by oracle into ``d/judge`` and random into ``d/clip``
    (the composed-selection tests' two score folders); returns the corpus."""
    from halsift.filtering.scoring.runner import score

    corpus = make_corpus(d / "corpus", shards=4, per_shard=6)
    score("oracle", corpus, d / "judge", show_progress=False)
    score("random:seed=1", corpus, d / "clip", show_progress=False)
    return corpus


def restamp(scores: Path) -> Path:
    """Record the parts of a score folder edited on purpose by a test in its manifest (``part_records``), as
    ``halsift score`` records the parts it writes: select refuses a part that differs from its record."""
    import json

    try:
        from halsift.filtering.scoring.part_records import RECORDS, part_record
    except ImportError:  # a halsift that records no parts (before 35) checks none: nothing to record
        return scores
    path = scores / "_manifest.json"
    m = json.loads(path.read_text())
    m[RECORDS] = {p.name: part_record(p) for p in sorted(scores.glob("part-*.parquet"))}
    path.write_text(json.dumps(m))
    return scores


def remote_code_model(folder: Path, marker: Path) -> Path:
    """A model folder whose config needs remote code: importing its ``configuration_evil.py`` writes ``marker``
    (so a test sees whether transformers ran the folder's Python)."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "evil", "architectures": ["EvilModel"],
                                                    "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}}))
    (folder / "configuration_evil.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import PretrainedConfig\nclass EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n")
    return folder


def write_png_shards(folder: Path, pairs, maxcount: int) -> Path:
    """Shards of ``(png bytes, caption)`` pairs, keys ``s0000``..., captioner ``test`` (i2t), ``maxcount`` a shard."""
    from halsift.corpus.shards import Sample, ShardWriter

    with ShardWriter(folder, maxcount=maxcount) as w:
        for i, (image, caption) in enumerate(pairs):
            w.write(Sample(key=f"s{i:04d}", image=image, caption=caption, ext="png",
                           meta={"captioner": "test", "source": "i2t"}))
    return folder
