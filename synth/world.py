"""Write a whole synthetic world: corpus shards, an annotated bench (i2t + t2i), a retrieval set, pre-training shards.

Layout under ``out`` (the contract in the team notes):
``corpus/`` shards to be filtered (one caption by one simulated captioner per image, ground-truth ``sentences``
in the json), ``bench/bench.jsonl`` + ``bench/images/`` (every bench image captioned by all six captioners, every
prompt drawn by all three t2i generators; train/val/test split by image), ``retrieval/retrieval.jsonl`` +
``retrieval/images/`` (held-out images, five captions each by captioners that do not write the corpus),
``pretrain/`` shards of web alt-text pairs (json ``detailed``: a clean detailed caption for the VLM captioner),
``zeroshot/<task>/`` zero-shot classification tasks in CLIP_benchmark's wds layout (:mod:`.zeroshot_tasks`),
``compositional/`` SugarCrepe's seven hard-negative categories (:mod:`.hard_negatives`),
and ``world.json`` (seed, sizes, designed rates of every generator).

Every item is drawn from its own ``random.Random(f"{seed}/{stream}/{index}")``, so items are independent of
generation order (parallelisable) and the same seed gives byte-identical files. The world is built in a
temporary folder and moved into place at the end, so an interrupted run leaves no half-written world.
"""

from __future__ import annotations

import json
import os
import random
from functools import partial
from pathlib import Path

from halsift.corpus.bench import BenchRow, write_bench
from halsift.corpus.progress import progress
from halsift.corpus.shards import Sample, ShardWriter, write_json_atomic
from halsift.corpus.safe_paths import remove_file, remove_tree, replace_path
from .captioners import PROFILE_BY_NAME, PROFILES, caption, check_captioner_names
from .hard_negatives import write_compositional
from .leaks import copy_key, exact_copy, leak_key, near_copy, plan
from .render import png_bytes, render
from .scene import sample_scene
from .styles import RETRIEVAL_STYLES, alt_text, human_caption, scene_family
from .t2i import T2I_PROFILES, make_prompt, sample_prompt_scene, t2i_sample
from .world_config import check_corpus_sentences
from .zeroshot_tasks import TASKS as ZEROSHOT_TASKS, write_zeroshot_tasks

PARTS = ("corpus", "bench", "retrieval", "pretrain", "zeroshot", "compositional", "world.json")
EVAL_SETS = ("zeroshot", "compositional")  # written only when their size is > 0; world.json does not list them
SPLIT_P = (("train", 0.6), ("val", 0.1), ("test", 0.3))
RETRIEVAL_FAMILY = 5  # retrieval_style human: images per family of look-alikes (same shapes, new places and counts)


def _rng(seed: int, stream: str, index: int, *extra: str) -> random.Random:
    return random.Random("/".join([str(seed), stream, str(index), *extra]))


def _split(rng: random.Random) -> str:
    u, acc = rng.random(), 0.0
    for name, p in SPLIT_P:
        acc += p
        if u < acc:
            return name
    return SPLIT_P[-1][0]


def _caption_text(sentences: list[dict]) -> str:
    return " ".join(s["text"] for s in sentences)


def _image(scene, size: int, rng: random.Random) -> bytes:
    return png_bytes(render(scene, size, seed=rng.randrange(2**31)))


def _write_png(path: Path, data: bytes) -> None:
    path.write_bytes(data)  # inside the temporary world folder: the whole folder is moved at the end


def _window(sents: list[dict], lo: int, hi: int, rng: random.Random) -> list[dict]:
    """``lo``-``hi`` consecutive sentences starting anywhere, renumbered from position 0 (a caption of its own)."""
    k = min(len(sents), rng.randint(lo, hi))
    start = rng.randrange(len(sents) - k + 1)
    return [{**s, "position": i} for i, s in enumerate(sents[start:start + k])]


def corpus_sample(seed: int, index: int, image_size: int, captioners: tuple[str, ...] = (),
                  sentences: tuple[int, int] | None = None) -> Sample:
    """The ``index``-th corpus pair: one image, one caption by a captioner drawn from ``captioners`` (names of
    :data:`~.captioners.PROFILES`; empty = all six); ``sentences=(lo, hi)`` cuts it to ``lo``-``hi`` consecutive
    sentences starting anywhere (short captions; None: the whole caption)."""
    rng = _rng(seed, "corpus", index)
    scene = sample_scene(rng)
    img = _image(scene, image_size, rng)
    profiles = [PROFILE_BY_NAME[c] for c in captioners] or PROFILES
    prof = profiles[rng.randrange(len(profiles))]
    sents = caption(scene, prof, rng)
    if sentences:
        sents = _window(sents, *sentences, rng)
    key = f"c{index:07d}"
    meta = {"captioner": prof.name, "source": "i2t", "image_id": key, "domain": scene.domain,
            "sentences": sents, "scene": scene.to_json()}
    return Sample(key, img, _caption_text(sents), meta, ext="png")


def pretrain_sample(seed: int, index: int, image_size: int) -> Sample:
    """The ``index``-th pre-training pair: web alt-text as the caption (what the base CLIP learns from), and in
    the json ``detailed``, a clean 2-4 sentence caption (what the world's VLM captioner is pre-trained on)."""
    rng = _rng(seed, "pretrain", index)
    scene = sample_scene(rng)
    img = _image(scene, image_size, rng)
    prof = PROFILES[rng.randrange(len(PROFILES))]
    sents = caption(scene, prof, rng, clean=True, max_sentences=rng.randint(2, 4))
    key = f"p{index:07d}"
    meta = {"captioner": "alt-text", "source": "i2t", "image_id": key, "domain": scene.domain,
            "detailed": _caption_text(sents), "sentences": sents, "scene": scene.to_json()}
    return Sample(key, img, alt_text(scene, rng), meta, ext="png")


def bench_i2t(seed: int, index: int, image_size: int, images_dir: Path) -> list[BenchRow]:
    """One bench image captioned by every i2t profile; writes the image, returns its rows."""
    rng = _rng(seed, "bench", index)
    scene = sample_scene(rng)
    image_id = f"b{index:06d}"
    _write_png(images_dir / f"{image_id}.png", _image(scene, image_size, rng))
    split = _split(rng)
    rows = []
    for prof in PROFILES:
        sents = caption(scene, prof, _rng(seed, "bench", index, prof.name))
        rows += _rows(sents, image_id, prof.name, "i2t", scene.domain, split)
    return rows


def bench_t2i(seed: int, index: int, image_size: int, images_dir: Path) -> list[BenchRow]:
    """One prompt drawn by every t2i generator (an image each); returns the labelled prompt sentences."""
    rng = _rng(seed, "t2i", index)
    scene = sample_prompt_scene(rng)
    prompt = make_prompt(scene, rng)
    split = _split(rng)
    rows = []
    for prof in T2I_PROFILES:
        grng = _rng(seed, "t2i", index, prof.name)
        drawn, sents = t2i_sample(scene, prof, grng, prompt)
        image_id = f"t{index:06d}-{prof.name}"
        _write_png(images_dir / f"{image_id}.png", _image(drawn, image_size, grng))
        rows += _rows(sents, image_id, prof.name, "t2i", scene.domain, split)
    return rows


def _rows(sents: list[dict], image_id: str, gen: str, gtype: str, domain: str, split: str) -> list[BenchRow]:
    caption_id = image_id if gtype == "t2i" else f"{image_id}-{gen}"
    text = _caption_text(sents)
    return [BenchRow(id=f"{caption_id}-{s['position']}", image=f"images/{image_id}.png", image_id=image_id,
                     generator=gen, generator_type=gtype, domain=domain, caption_id=caption_id,
                     position=s["position"], sentence=s["text"], caption=text, label=s["label"],
                     types=list(s["types"]), spans=[list(sp) for sp in s["spans"]], split=split)
            for s in sents]


def retrieval_scene(seed: int, index: int, style: str = "captioners"):
    """``(scene, rng)`` of retrieval image ``index``: its scene, and its stream with the scene drawn from it."""
    rng = _rng(seed, "retrieval", index)
    if style == "human":
        base = sample_scene(_rng(seed, "retrieval-family", index // RETRIEVAL_FAMILY))
        return scene_family(base, rng), rng
    return sample_scene(rng), rng


def leak_sample(seed: int, j: int, retrieval_index: int, png: bytes, style: str,
                captioners: tuple[str, ...] = (), sentences: tuple[int, int] | None = None) -> Sample:
    """Planted leak ``j``: a near copy of retrieval image ``retrieval_index`` (``png``, :func:`.leaks.near_copy`)
    captioned by the corpus captioner from that image's scene."""
    scene, _ = retrieval_scene(seed, retrieval_index, style)
    rng = _rng(seed, "leak", j)
    img = near_copy(png, rng)
    profiles = [PROFILE_BY_NAME[c] for c in captioners] or PROFILES
    prof = profiles[rng.randrange(len(profiles))]
    sents = caption(scene, prof, rng)
    if sentences:
        sents = _window(sents, *sentences, rng)
    key = leak_key(j)
    meta = {"captioner": prof.name, "source": "i2t", "image_id": key, "domain": scene.domain,
            "sentences": sents, "scene": scene.to_json()}
    return Sample(key, img, _caption_text(sents), meta, ext="jpg")


def retrieval_item(seed: int, index: int, image_size: int, images_dir: Path, style: str = "captioners",
                   held_out: tuple[str, ...] = ()) -> dict:
    """A held-out image with five correct captions.

    ``style="captioners"``: each caption is 2-3 consecutive sentences, starting anywhere, of a clean caption by a
    captioner in ``held_out`` (those that do not write the corpus; empty = all six), so no filter wins by
    matching the corpus captioner's template or by keeping the opening overview. ``style="human"``: short
    human-style sentences (:func:`~.styles.human_caption`) over families of :data:`RETRIEVAL_FAMILY` look-alikes
    (:func:`~.styles.scene_family`); the tiny CLIP does not transfer to that syntax (docs/table_f.md).
    """
    name = f"r{index:06d}.png"
    if style == "human":
        family = index // RETRIEVAL_FAMILY
        scene, rng = retrieval_scene(seed, index, style)
        _write_png(images_dir / name, _image(scene, image_size, rng))
        caps = [human_caption(scene, rng) for _ in range(5)]
        return {"image": f"images/{name}", "captions": caps, "family": family, "scene": scene.to_json()}
    scene, rng = retrieval_scene(seed, index, style)
    _write_png(images_dir / name, _image(scene, image_size, rng))
    profiles = [PROFILE_BY_NAME[c] for c in held_out] or list(PROFILES)
    caps, writers = [], []
    for _ in range(5):
        prof = rng.choice(profiles)
        sents = caption(scene, prof, rng, clean=True)
        caps.append(_caption_text(_window(sents, 2, 3, rng)))
        writers.append(prof.name)
    return {"image": f"images/{name}", "captions": caps, "captioners": writers, "scene": scene.to_json()}


def generate_world(out: str | os.PathLike, images: int = 2000, seed: int = 0, image_size: int = 64,
                   bench_images: int | None = None, retrieval_images: int | None = None,
                   pretrain_images: int | None = None, t2i_prompts: int | None = None, shard_size: int = 256,
                   overwrite: bool = False, show_progress: bool = False,
                   captioners: tuple[str, ...] | list[str] = (), retrieval_style: str = "captioners",
                   corpus_sentences: tuple[int, int] | list[int] = (), zeroshot_images: int | None = None,
                   compositional_images: int | None = None, leaks: float = 0.0, exact_copies: int = 0,
                   workers: int = 1) -> dict:
    """Write a synthetic world under ``out`` and return what ``world.json`` holds.

    ``images`` corpus pairs, captioned by ``captioners`` (profile names; empty = all six: HalDec Table F's corpus
    is one captioner's output), each cut to ``corpus_sentences`` = (lo, hi) consecutive sentences when given;
    retrieval captions in ``retrieval_style`` (:func:`retrieval_item`);
    ``bench_images`` (default ``max(24, images // 4)``) bench images, each captioned by the six captioners;
    ``t2i_prompts`` (default ``max(12, bench_images // 2)``) prompts drawn by the three t2i generators; ``retrieval_images`` (default ``max(20, images // 10)``); ``pretrain_images`` (default
    ``images``) clean pairs; near copies of ``round(leaks * retrieval_images)`` distinct retrieval images and
    ``exact_copies`` byte-identical copies of corpus samples planted in the corpus (:mod:`.leaks`; recorded in
    ``world.json``); ``zeroshot_images`` per zero-shot task and ``compositional_images`` (each default
    ``max(12, images // 30)``; 0 = not written). Those two sets come from their own random streams, after
    everything else, and are not in ``world.json``: the other parts are the same bytes with or without
    them. ``workers``: processes making the corpus and pretrain samples (spawned: the caller's main module must be
    import-safe; :func:`default_workers` is what ``halsift run`` uses; the bytes are the same for any number). Raises ``FileExistsError`` when ``out`` already holds a world and not
    ``overwrite``.
    """
    if images < 1:
        raise ValueError(f"images must be >= 1, got {images}")
    if image_size < 32:
        raise ValueError(f"image_size must be >= 32 pixels, got {image_size}")
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    captioners = tuple(captioners)
    check_captioner_names(captioners)
    window = check_corpus_sentences(corpus_sentences)
    if retrieval_style not in RETRIEVAL_STYLES:
        raise ValueError(f"retrieval_style: expected one of {RETRIEVAL_STYLES}, got {retrieval_style!r}")
    held_out = tuple(p.name for p in PROFILES if p.name not in captioners)
    bench_images = max(24, images // 4) if bench_images is None else bench_images
    t2i_prompts = max(12, bench_images // 2) if t2i_prompts is None else t2i_prompts
    retrieval_images = max(20, images // 10) if retrieval_images is None else retrieval_images
    pretrain_images = images if pretrain_images is None else pretrain_images
    zeroshot_images = max(12, images // 30) if zeroshot_images is None else zeroshot_images
    compositional_images = max(12, images // 30) if compositional_images is None else compositional_images
    if not 0 <= leaks <= 1:
        raise ValueError(f"leaks must be a share of the retrieval images in [0, 1], got {leaks}")
    for name, v in (("exact_copies", exact_copies), ("bench_images", bench_images), ("t2i_prompts", t2i_prompts),
                    ("retrieval_images", retrieval_images), ("pretrain_images", pretrain_images),
                    ("zeroshot_images", zeroshot_images), ("compositional_images", compositional_images)):
        if v < 0:
            raise ValueError(f"{name} must be >= 0, got {v}")

    out = Path(out)
    existing = [p for p in PARTS if (out / p).exists()]
    if existing and not overwrite:
        raise FileExistsError(f"{out}: already holds {', '.join(existing)} (overwrite=True replaces them)")
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".world.tmp{os.getpid()}"
    if tmp.exists():
        remove_tree(tmp)
    (tmp / "bench" / "images").mkdir(parents=True)
    (tmp / "retrieval" / "images").mkdir(parents=True)

    n_leaks = round(leaks * retrieval_images)
    extras = plan(seed, images, retrieval_images, n_leaks, exact_copies)
    total = images + bench_images + t2i_prompts + retrieval_images + pretrain_images
    total += compositional_images + zeroshot_images * len(ZEROSHOT_TASKS)
    bar = progress(total=total, desc="synth", unit="img", disable=not show_progress)
    try:
        n_rows = _write_parts(tmp, bar, seed, image_size, shard_size, images, captioners, bench_images,
                              t2i_prompts, retrieval_images, retrieval_style, held_out, pretrain_images, window, extras,
                              workers)
        if zeroshot_images:
            write_zeroshot_tasks(tmp / "zeroshot", seed, zeroshot_images, image_size, bar)
        if compositional_images:
            write_compositional(tmp / "compositional", seed, compositional_images, image_size, bar)
    except BaseException:
        remove_tree(tmp, ignore_errors=True)
        raise
    finally:
        bar.close()

    world = {
        "seed": seed, "image_size": image_size, "version": 2,
        "corpus_captioners": list(captioners) or [p.name for p in PROFILES], "retrieval_style": retrieval_style,
        **({"corpus_sentences": list(window)} if window else {}),
        "sizes": {"corpus": images, "bench_images": bench_images, "t2i_prompts": t2i_prompts,
                  "bench_rows": n_rows, "retrieval": retrieval_images, "pretrain": pretrain_images,
                  "shard_size": shard_size},
        "generators": {**{p.name: p.design() for p in PROFILES}, **{p.name: p.design() for p in T2I_PROFILES}},
    }
    if n_leaks or exact_copies:  # ground truth of the planted duplicates (absent otherwise: old worlds unchanged)
        world["sizes"]["corpus_total"] = images + n_leaks + exact_copies
        world["leaks"] = {leak_key(j): f"images/r{r:06d}.png" for v in extras.values() for kind, j, r in v
                          if kind == "leak"}
        world["exact_copies"] = {copy_key(j): f"c{src:07d}" for v in extras.values() for kind, j, src in v
                                 if kind == "copy"}
    write_json_atomic(tmp / "world.json", world)
    for part in PARTS:  # move into place; world.json last, so its presence means the world is complete
        target = out / part
        if target.is_dir():
            remove_tree(target)
        elif target.exists():
            remove_file(target)
        if part in EVAL_SETS and not (tmp / part).exists():
            continue
        replace_path(tmp / part, target)
    remove_tree(tmp, ignore_errors=True)
    return world


def _write_parts(tmp: Path, bar, seed: int, image_size: int, shard_size: int, images: int,
                 captioners: tuple[str, ...], bench_images: int, t2i_prompts: int, retrieval_images: int,
                 retrieval_style: str, held_out: tuple[str, ...], pretrain_images: int,
                 window: tuple[int, int] | None = None, extras: dict[int, list] | None = None,
                 workers: int = 1) -> int:
    """Write retrieval, corpus (with the planted ``extras``: :func:`.leaks.plan`), bench and pretrain under ``tmp``
    (every item has its own random stream: the order changes no byte); returns the bench rows."""
    retrieval = []
    for i in range(retrieval_images):
        retrieval.append(retrieval_item(seed, i, image_size, tmp / "retrieval" / "images", retrieval_style, held_out))
        bar.update()
    _write_jsonl(tmp / "retrieval" / "retrieval.jsonl", retrieval)
    pool = _SamplePool(workers)
    with ShardWriter(tmp / "corpus", maxcount=shard_size) as w:
        made = pool.in_order(partial(corpus_sample, seed, image_size=image_size, captioners=captioners,
                                     sentences=window), images)
        for i, sample in enumerate(made):
            w.write(sample)
            for kind, j, arg in (extras or {}).get(i, ()):
                if kind == "leak":
                    png = (tmp / "retrieval" / "images" / f"r{arg:06d}.png").read_bytes()
                    w.write(leak_sample(seed, j, arg, png, retrieval_style, captioners, window))
                else:
                    w.write(exact_copy(corpus_sample(seed, arg, image_size, captioners, window), j))
            bar.update()
    rows: list[BenchRow] = []
    for i in range(bench_images):
        rows += bench_i2t(seed, i, image_size, tmp / "bench" / "images")
        bar.update()
    for i in range(t2i_prompts):
        rows += bench_t2i(seed, i, image_size, tmp / "bench" / "images")
        bar.update()
    n_rows = write_bench(tmp / "bench" / "bench.jsonl", rows)
    with ShardWriter(tmp / "pretrain", maxcount=shard_size) as w:
        for sample in pool.in_order(partial(pretrain_sample, seed, image_size=image_size), pretrain_images):
            w.write(sample)
            bar.update()
    return n_rows


PARALLEL_FROM = 2000  # corpus + pretrain samples from which worker processes pay for their start (~1 s each)


def default_workers(images: int, pretrain_images: int | None = None) -> int:
    """Processes making a world's corpus and pretrain samples (``pretrain_images`` None: as many as ``images``):
    one per core (at most 8) from :data:`PARALLEL_FROM` samples, else 1 (this process)."""
    samples = images + (images if pretrain_images is None else pretrain_images)
    return min(8, os.cpu_count() or 1) if samples >= PARALLEL_FROM else 1


class _SamplePool:
    """``fn(0..n-1)`` in order, made in this process or across ``workers`` processes; every sample has its own random
    stream (:func:`_rng`), so which process makes it changes no byte. Samples are made in windows, so memory stays
    bounded by the window whatever the world's size."""

    WINDOW = 1024

    def __init__(self, workers: int) -> None:
        self.workers = max(1, int(workers))

    def in_order(self, fn, n: int):
        if self.workers == 1 or n < 2:
            yield from map(fn, range(n))
            return
        import multiprocessing
        import warnings
        from concurrent.futures import ProcessPoolExecutor
        from concurrent.futures.process import BrokenProcessPool

        done = 0
        try:
            with ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
                for start in range(0, n, self.WINDOW):
                    window = range(start, min(n, start + self.WINDOW))
                    for sample in pool.map(fn, window, chunksize=max(1, len(window) // (4 * self.workers))):
                        yield sample
                        done += 1
        except BrokenProcessPool as e:  # e.g. a parent read from stdin, which spawned processes cannot re-import
            warnings.warn(f"synth: worker processes stopped ({e}); making the other samples in this process",
                          stacklevel=2)
            self.workers = 1
            yield from map(fn, range(done, n))


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n")
