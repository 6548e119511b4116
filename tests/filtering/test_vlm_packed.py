"""The ``vlm`` judge's packed path (all sentences of an image in one sequence under a block mask) and the image
processor run in the scoring step (``preprocess=device``), against one plain forward pass per sentence, on tiny
random models built locally (no hub access)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from PIL import Image  # noqa: E402

from halsift.filtering.detectors.base import Item  # noqa: E402

PACKABLE = ["qwen2-vl", "llava", "idefics3"]  # gemma3 (sliding windows) falls back: test_packing_falls_back
SENTS = ["a red dog is sitting on the grass.", "the cat is next to a kid in the park.", "two birds fly.",
         "a sign reads stop.", "there is a blue car behind the tree.", "one man wearing a hat.",
         "the sky is blue above the house.", "a small white ball under the table."]


@pytest.fixture(scope="module")
def tiny_vlms(tmp_path_factory):
    from halsift.synth.tiny_vlm import build_tiny_vlm

    root = tmp_path_factory.mktemp("tiny_vlm_packed")
    return {a: build_tiny_vlm(a, root / a, seed=0, init_std=0.5) for a in PACKABLE + ["gemma3"]}


def _captions(n_sent: int, n_captions: int = 3) -> list[Item]:
    """``n_captions`` captions of ``n_sent`` sentences each, on images of different sizes and colours."""
    items = []
    for g in range(n_captions):
        img = Image.new("RGB", (56 + 14 * g, 56 + 7 * g), (40 * g % 255, 200 - 30 * g, 90))
        img.putpixel((3, 3 + g), (255, 0, 0))
        caption = [SENTS[(g + i) % len(SENTS)] for i in range(n_sent)]
        items += [Item(f"k{g}", i, s, caption[:i], img, f"img{g}") for i, s in enumerate(caption)]
    return items


def _det(path, **kw):
    from halsift.filtering.detectors.vlm import VlmDetector

    return VlmDetector(model=str(path), dtype="float32", device="cpu", **kw)


def _scores(det, items) -> list[float]:
    return [r.score for r in det.score_batch(items)]


@pytest.mark.parametrize("arch", PACKABLE)
@pytest.mark.parametrize("context", [False, True])
@pytest.mark.parametrize("n_sent", [1, 8])
def test_packed_sentences_equal_one_pass_per_sentence(tiny_vlms, arch, context, n_sent):
    """Packed scores (one sequence per image: prefix + every sentence, block mask, positions restarting after
    the prefix) equal a plain full forward pass per sentence and the KV-cache reuse path, within 1e-3."""
    items = _captions(n_sent)
    single = _det(tiny_vlms[arch], reuse_prefix=False, forward_batch=1, context=context)
    ref = [single.score_batch([it])[0].score for it in items]
    packed = _det(tiny_vlms[arch], pack=True, context=context, forward_batch=64)
    assert packed.packs
    got = _scores(packed, items)
    assert got == pytest.approx(ref, abs=1e-3)
    assert _scores(_det(tiny_vlms[arch], pack=False, context=context, forward_batch=64), items) == \
        pytest.approx(ref, abs=1e-3)
    assert max(ref) - min(ref) > 0.1  # not vacuous: the scores differ between sentences


def test_packed_yes_prob_eager_attention_and_split_captions(tiny_vlms):
    """``yes_prob`` packs too; an eager-attention model takes the additive mask; a caption split over batches
    (forward_batch below its sentence count) re-encodes its image and keeps its scores."""
    items = _captions(8)
    path = tiny_vlms["qwen2-vl"]
    for opts in (dict(mode="yes_prob"), dict(attn_implementation="eager"), dict(forward_batch=5)):
        ref = [r.score for r in _det(path, reuse_prefix=False, **opts).score_batch(items)]
        det = _det(path, pack=True, **opts)
        assert det.packs, opts
        assert _scores(det, items) == pytest.approx(ref, abs=1e-3), opts


def test_packing_falls_back_where_it_cannot_serve(tiny_vlms):
    """Sliding-window models (Gemma 3) and attention implementations without 4-D masks take the KV-cache path
    (same scores); pack unset means packed on CUDA only."""
    gemma = _det(tiny_vlms["gemma3"], pack=True)
    assert "sliding" in gemma.judge.packing_blocker() and not gemma.packs
    items = _captions(3)
    assert _scores(gemma, items) == pytest.approx(_scores(_det(tiny_vlms["gemma3"], pack=False), items), abs=1e-6)
    qwen = _det(tiny_vlms["qwen2-vl"])
    assert qwen.pack is None and not qwen.packs  # auto on a CPU model: the KV-cache path
    qwen.judge.model.config._attn_implementation = "flash_attention_2"
    qwen.pack = True
    assert "4-D" in qwen.judge.packing_blocker() and not qwen.packs


@pytest.mark.parametrize("arch", PACKABLE + ["gemma3"])
def test_preprocess_device_defers_the_image_processor_with_equal_features(tiny_vlms, arch):
    """``preprocess=device``: once an image size has been seen, ``prepare`` leaves the image to the scoring step
    (uint8 pixels + cached token ids); the resolved features equal the processor's, and so do the scores."""
    items = _captions(2)
    host = _det(tiny_vlms[arch], preprocess="cpu")
    dev = _det(tiny_vlms[arch], preprocess="device")
    assert dev.defers_images and not host.defers_images
    first = dev.prepare(items)
    assert not any("_image" in p for p in first["prefixes"])  # sizes not seen yet: the whole processor on CPU
    again = dev.prepare(items)
    assert all("_image" in p and p["_image"].dtype == torch.uint8 for p in again["prefixes"])
    want = host.prepare(items)["prefixes"]
    for got, ref in zip(dev.judge.resolve_images(again["prefixes"]), want):
        assert set(got) == set(ref)
        for k in ref:
            assert got[k].shape == ref[k].shape and torch.allclose(got[k].float(), ref[k].float(), atol=1e-5), k
    assert [r.score for r in dev.score_prepared(items, again)] == pytest.approx(_scores(host, items), abs=1e-3)


def test_preprocess_option_is_checked(tiny_vlms):
    from halsift.filtering.detectors.spec import SpecError, load_detector

    with pytest.raises(SpecError, match="preprocess='gpu': expected one of"):
        load_detector(f"vlm:model={tiny_vlms['llava']},preprocess=gpu")
    det = load_detector(f"vlm:model={tiny_vlms['llava']},pack=true,preprocess=device,dtype=float32")
    assert det.packs and det.defers_images


def test_equal_size_vision_attention_matches_per_image_attention(tiny_vlms):
    """Qwen2-VL's vision tower with one attention call for equal-size images gives the per-image features; with
    unequal images (or another architecture) nothing is replaced."""
    from halsift.filtering.detectors.vlm_vision import equal_patches, equal_size_attention

    det = _det(tiny_vlms["qwen2-vl"], preprocess="cpu")
    imgs = [Image.new("RGB", (84, 56), (30 * i, 90, 200 - 20 * i)) for i in range(3)]
    for i, im in enumerate(imgs):
        im.putpixel((5 + i, 7), (255, 255, 0))
    feats = det.processor.image_processor(images=imgs, return_tensors="pt")
    patches = equal_patches(feats)
    assert patches == feats["pixel_values"].shape[0] // 3
    vis = det.model.model.visual
    with torch.no_grad():
        ref = vis(feats["pixel_values"], grid_thw=feats["image_grid_thw"]).pooler_output
        with equal_size_attention(det.model, patches) as active:
            got = vis(feats["pixel_values"], grid_thw=feats["image_grid_thw"]).pooler_output
    assert active and "forward" not in vis.blocks[0].attn.__dict__  # replaced only while active
    ref, got = torch.cat(list(ref)) if isinstance(ref, (list, tuple)) else ref, \
        torch.cat(list(got)) if isinstance(got, (list, tuple)) else got
    assert torch.allclose(got, ref, rtol=1e-5, atol=1e-4) and ref.abs().max() > 1
    mixed = det.processor.image_processor(images=[imgs[0], Image.new("RGB", (56, 56))], return_tensors="pt")
    assert equal_patches(mixed) is None
    with equal_size_attention(_det(tiny_vlms["llava"]).model, 16) as active:
        assert not active


def test_fused_vision_rope_equals_transformers():
    """The vision rotary embedding written as multiply-adds equals transformers' ``apply_rotary_pos_emb_vision``."""
    from transformers.models.qwen2_vl import modeling_qwen2_vl as M

    from halsift.filtering.detectors.vlm_vision import _rope

    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 50, 4, 16, generator=g).to(torch.bfloat16).unbind(0)
    ang = torch.randn(50, 16, generator=g)
    ref_q, ref_k = M.apply_rotary_pos_emb_vision(q, k, ang.cos(), ang.sin())
    got_q, got_k = _rope(torch.stack([q, k]), ang.cos(), ang.sin()).unbind(0)
    assert got_q.dtype == torch.bfloat16
    assert torch.allclose(got_q.float(), ref_q.float(), atol=1e-2)
    assert torch.allclose(got_k.float(), ref_k.float(), atol=1e-2)
    q32, k32 = torch.randn(2, 50, 4, 16, generator=g).unbind(0)
    ref = torch.stack(M.apply_rotary_pos_emb_vision(q32, k32, ang.cos(), ang.sin()))
    assert torch.allclose(_rope(torch.stack([q32, k32]), ang.cos(), ang.sin()), ref, atol=1e-6)


def test_host_and_device_prefixes_of_one_size_concatenate(tiny_vlms):
    """In one batch the first image of a new size is processed on the host and the next ones of that size on the
    device; ``resolve_images`` leaves every image feature on the model's device and every text feature on the host,
    so the packed path can concatenate them (checked with a ``meta`` device standing in for CUDA), and the scores
    of such a mixed batch equal the host path's."""
    from halsift.filtering.detectors.vlm import VlmDetector

    img = Image.new("RGB", (70, 56), (20, 120, 60))
    other = Image.new("RGB", (70, 56), (200, 20, 60))
    items = [Item("a", 0, SENTS[0], [], img, "a"), Item("a", 1, SENTS[1], [SENTS[0]], img, "a"),
             Item("b", 0, SENTS[2], [], other, "b")]
    for arch in ("qwen2-vl", "llava"):
        host = _det(tiny_vlms[arch], preprocess="cpu", pack=True)
        dev = VlmDetector.from_model(host.model, host.processor, pack=True, preprocess="device")
        prepared = dev.prepare(items)
        assert ["_image" in p for p in prepared["prefixes"]] == [False, True]  # a miss, then a hit of that size
        assert [r.score for r in dev.score_prepared(items, prepared)] == pytest.approx(_scores(host, items), abs=1e-3)
        dev.judge.device = torch.device("meta")
        placed = dev.judge.resolve_images(dev.prepare(items[:1] + items[2:])["prefixes"] + prepared["prefixes"][:1])
        text = {"input_ids", "attention_mask", "mm_token_type_ids"}
        for p in placed:
            assert {k: v.device.type for k, v in p.items()} == {k: "cpu" if k in text else "meta" for k in p}, arch
        merged = {n: torch.cat([p[n] for p in placed]) for n in placed[0]}
        assert merged["pixel_values"].device.type == "meta" and merged["input_ids"].device.type == "cpu"


def test_shared_prefix_positions_equal_per_row_positions(tiny_vlms):
    """Rows of one prompt and one image size take the first row's M-RoPE positions: the same as per row."""
    det = _det(tiny_vlms["qwen2-vl"], preprocess="cpu")
    imgs = [Image.new("RGB", (84, 56), (30 * i, 90, 20)) for i in range(3)]
    feats = [det.prefix_inputs(im) for im in imgs]
    batch = det.judge.on_device({k: torch.cat([f[k] for f in feats]) for k in feats[0]})
    shared, per_row = det.judge._prefix_positions(batch, True), det.judge._prefix_positions(batch, False)
    assert shared[0].shape == per_row[0].shape == (3, 3, batch["input_ids"].shape[1])
    assert torch.equal(shared[0], per_row[0]) and torch.equal(shared[1], per_row[1])
    assert int(per_row[1][0]) != 0  # the image's positions are not the plain token indices


def test_score_with_decode_workers_and_deferred_images_writes_the_host_scores(tiny_vlms, tmp_path):
    """``halsift score`` with a packed judge whose image processor runs in the scoring step, its ``prepare`` in a
    decode worker (uint8 pixels and cached token ids cross the pipe), writes the scores of the host path."""
    import pyarrow.parquet as pq
    from filtering_data import make_corpus

    from halsift.launch.cli import main

    data = make_corpus(tmp_path / "data", shards=2, per_shard=3)  # 32 px images: all but the first deferred
    spec = f"vlm:model={tiny_vlms['qwen2-vl']},dtype=float32,forward_batch=8"
    base = ["score", "--data", str(data), "--no-progress", "--batch-size", "8"]
    assert main([*base, "--detector", spec + ",pack=false,preprocess=cpu", "--out", str(tmp_path / "host")]) == 0
    assert main([*base, "--detector", spec + ",pack=true,preprocess=device", "--out", str(tmp_path / "dev"),
                 "--decode-workers", "1"]) == 0
    names = sorted(p.name for p in (tmp_path / "host").glob("part-*.parquet"))
    assert names and names == sorted(p.name for p in (tmp_path / "dev").glob("part-*.parquet"))
    for name in names:
        a, b = (pq.read_table(tmp_path / d / name).to_pydict() for d in ("host", "dev"))
        assert a["key"] == b["key"] and len(a["score"]) > 2
        assert max(abs(x - y) for x, y in zip(a["score"], b["score"])) < 1e-3


def test_generation_modes_take_deferred_images(tiny_vlms):
    """``mode=prompt`` (left-padded full sequences, generation) reads the same inputs with ``preprocess=device``."""
    items = _captions(2)
    host = _det(tiny_vlms["llava"], mode="prompt", max_new_tokens=3, preprocess="cpu")
    dev = _det(tiny_vlms["llava"], mode="prompt", max_new_tokens=3, preprocess="device")
    dev.prepare(items)  # sees the sizes
    prepared = dev.prepare(items)
    assert all("_image" in p for p in prepared["prefixes"])
    dev.score_prepared(items, prepared)
    host.score_batch(items)
    assert dev.last_texts == host.last_texts and any(dev.last_texts)


@pytest.mark.parametrize("arch", ["qwen2-vl", "llava"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_rows_of_one_sentence_right_padded(tiny_vlms, arch, attn):
    """Images of one size in one packed batch, one sentence each of different lengths (rows right-padded, no block
    mask needed: the causal one) and a batch mixing one- and two-sentence rows: the per-sentence scores."""
    imgs = [Image.new("RGB", (70, 56), (40 * g, 200 - 30 * g, 90)) for g in range(3)]
    one = [Item(f"k{g}", 0, SENTS[g * 2], [], im, f"img{g}") for g, im in enumerate(imgs)]
    mixed = one + [Item("k0", 1, SENTS[5], [SENTS[0]], imgs[0], "img0")]
    for items in (one, mixed):
        ref = [_det(tiny_vlms[arch], reuse_prefix=False, attn_implementation=attn).score_batch([it])[0].score
               for it in items]
        det = _det(tiny_vlms[arch], pack=True, attn_implementation=attn)
        assert det.packs
        assert _scores(det, items) == pytest.approx(ref, abs=1e-3)
        assert max(ref) - min(ref) > 0.1
