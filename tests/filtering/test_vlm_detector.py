"""The ``vlm`` judge detector on tiny random Qwen2-VL / LLaVA models built locally (no hub access)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from PIL import Image  # noqa: E402

from halsift.filtering.detectors.base import Item  # noqa: E402
from halsift.filtering.detectors.vlm_prompts import parse_score  # noqa: E402

ARCHS = ["qwen2-vl", "llava", "idefics3", "gemma3"]


@pytest.fixture(scope="session")
def tiny_vlms(tmp_path_factory):
    """arch -> path of a saved tiny random VLM (large init std so that scores spread over 0..100)."""
    from halsift.synth.tiny_vlm import build_tiny_vlm

    root = tmp_path_factory.mktemp("tiny_vlm")
    return {a: build_tiny_vlm(a, root / a, seed=0, init_std=0.5) for a in ARCHS}


def _items(n_captions: int = 3) -> list[Item]:
    sents = ["a red dog is sitting on the grass.", "the cat is next to a kid in the park.", "two birds fly.",
             "a sign reads stop.", "there is a blue car behind the tree.", "one man wearing a hat."]
    items = []
    for g in range(n_captions):
        img = Image.new("RGB", (56 + 14 * g, 56 + 7 * g), (40 * g % 255, 200 - 30 * g, 90))
        caption = sents[g:g + 2 + g % 3]
        items += [Item(f"k{g}", i, s, caption[:i], img, f"img{g}") for i, s in enumerate(caption)]
    return items


def _det(path, **kw):
    from halsift.filtering.detectors.vlm import VlmDetector

    return VlmDetector(model=str(path), dtype="float32", device="cpu", **kw)


@pytest.mark.parametrize(
    "text,expected",
    [('{"score": 85}', 85), ('"score": 85, "reason": "x"', 85), ("\u201cscore\u201d: 40. The caption...", 40),
     ("Score: 85/100", 85), ("```json\n{\"score\": 7}\n```", 7), ("The score is 62 because", 62), ("90", 90),
     ("I give it 77/100.", 77), ("{'score': 30}", 30), ("no number here", None), ("score: 250", None), ("", None)])
def test_parse_score(text, expected):
    assert parse_score(text) == expected


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("mode", ["logits", "yes_prob"])
def test_batch_padding_and_prefix_reuse_match_single_items(tiny_vlms, arch, mode):
    items = _items()
    single = _det(tiny_vlms[arch], mode=mode, reuse_prefix=False, forward_batch=1)
    ref = [single.score_batch([it])[0].score for it in items]
    batched = [r.score for r in _det(tiny_vlms[arch], mode=mode, reuse_prefix=False, forward_batch=16).score_batch(items)]
    reused = _det(tiny_vlms[arch], mode=mode, reuse_prefix=True, forward_batch=16).score_batch(items)
    assert batched == pytest.approx(ref, abs=1e-3)
    assert [r.score for r in reused] == pytest.approx(ref, abs=1e-3)
    assert all(r.parsed for r in reused)
    assert max(ref) - min(ref) > 0.1  # the check is not vacuous: scores differ between items


def test_prefix_reuse_right_padding_path(tiny_vlms):
    """The right-padded continuation layout (used for sliding-window models) on a model without windows."""
    items = _items()
    det = _det(tiny_vlms["qwen2-vl"], forward_batch=16)
    assert det._mid_pad  # Qwen2-VL has no sliding window: pads go between prefix and continuation
    mid = [r.score for r in det.score_batch(items)]
    det._mid_pad = False
    right = [r.score for r in det.score_batch(items)]
    assert _det(tiny_vlms["gemma3"])._mid_pad is False
    ref = [r.score for r in _det(tiny_vlms["qwen2-vl"], reuse_prefix=False).score_batch(items)]
    assert right == pytest.approx(ref, abs=1e-3) and mid == pytest.approx(ref, abs=1e-3)



def test_forward_batch_is_its_own_name_and_the_old_one_still_works(tiny_vlms):
    """``forward_batch`` (rows per forward pass) is not score's ``--batch-size``: the vlm option's former name
    ``batch_size`` still works, with a warning, and keeps its spec text (so its fingerprint); both at once is an
    error naming them."""
    import warnings

    from halsift.filtering.detectors.spec import SpecError, check_spec, load_detector

    base = f"vlm:model={tiny_vlms['qwen2-vl']},dtype=float32,device=cpu,reuse_prefix=false"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = load_detector(f"{base},forward_batch=2")
    assert new.batch_size == 2
    with pytest.warns(FutureWarning, match=r"batch_size= is now forward_batch="):
        old = load_detector(f"{base},batch_size=2")
    # the canonical text main wrote for this spec before the rename (sorted keys), so the same fingerprint
    assert old.batch_size == 2
    assert old.spec == f"vlm:batch_size=2,device=cpu,dtype=float32,model={tiny_vlms['qwen2-vl']},reuse_prefix=false"
    items = _items()
    assert [r.score for r in old.score_batch(items)] == [r.score for r in new.score_batch(items)]
    check_spec(f"{base},batch_size=2")  # the dry run accepts the old name too
    with pytest.raises(SpecError, match=r"batch_size= and forward_batch= name the same vlm option"):
        load_detector(f"{base},batch_size=2,forward_batch=4")

def _manual_next_probs(det, item, extra=()):
    """Next-token distribution after prefix + continuation (+ extra tokens), by one plain forward pass."""
    pre = det.prefix_inputs(item.image)
    cont = det.tokenizer(" " + item.sentence + det._tail, add_special_tokens=False)["input_ids"] + list(extra)
    ids = torch.cat([pre["input_ids"], torch.tensor([cont])], 1)
    batch = {k: v for k, v in pre.items() if k not in ("input_ids", "attention_mask", "mm_token_type_ids")}
    if "mm_token_type_ids" in pre:
        zeros = torch.zeros((1, len(cont)), dtype=torch.long)
        batch["mm_token_type_ids"] = torch.cat([pre["mm_token_type_ids"], zeros], 1)
    with torch.no_grad():
        logits = det.model(input_ids=ids, attention_mask=torch.ones_like(ids), **batch).logits[0, -1]
    return logits.float().softmax(-1)


def test_logits_single_token_numbers_expected_value(tiny_vlms):
    det = _det(tiny_vlms["llava"])
    assert det.number_mode == "single"
    tok = det.tokenizer
    # every token that spells a number counts ("85" and " 85"); the added single tokens are among them
    strings = [tok.decode([i]).strip() for i in range(len(tok))]
    spelled = {n: [i for i, t in enumerate(strings) if t == str(n)] for n in range(101)}
    assert all(tok.convert_tokens_to_ids(str(n)) in spelled[n] for n in range(101))
    assert det.number_ids == spelled  # the public table that training reads
    assert any(len(v) > 1 for v in spelled.values())
    for it in _items(2):
        p = _manual_next_probs(det, it)
        m = torch.stack([p[spelled[n]].sum() for n in range(101)])
        m = m / m.sum()
        expected = float((m * torch.arange(101)).sum())
        assert det.score_batch([it])[0].score == pytest.approx(expected, abs=1e-3)


def test_logits_digit_tokenizer_resolves_1_10_100(tiny_vlms):
    det = _det(tiny_vlms["qwen2-vl"])
    assert det.number_mode == "digits"  # Qwen2-style tokenizers split numbers into digits
    tok = det.tokenizer
    assert tok.tokenize("100") == ["1", "0", "0"]
    d = [tok.convert_tokens_to_ids(str(i)) for i in range(10)]
    for it in _items(2):  # three separate passes instead of the detector's teacher-forced single pass
        p1 = _manual_next_probs(det, it)[d]
        p1 = p1 / p1.sum()
        q = _manual_next_probs(det, it, [d[1]])[d]
        r0 = float(_manual_next_probs(det, it, [d[1], d[0]])[d[0]])
        v1 = (1 - float(q.sum())) * 1 + sum(float(q[e]) * (10 + e) for e in range(1, 10)) \
            + float(q[0]) * (r0 * 100 + (1 - r0) * 10)
        values = [0.0, v1] + [10 * k + 4.5 for k in range(2, 10)]
        expected = sum(float(p1[k]) * values[k] for k in range(10))
        assert det.score_batch([it])[0].score == pytest.approx(expected, abs=1e-3)


def test_prompt_mode_parses_greedy_text_and_batch_invariant(tiny_vlms):
    items = _items(2)
    det = _det(tiny_vlms["qwen2-vl"], mode="prompt", max_new_tokens=6, forward_batch=16)
    res = det.score_batch(items)
    texts = list(det.last_texts)
    one = _det(tiny_vlms["qwen2-vl"], mode="prompt", max_new_tokens=6, forward_batch=1)
    singles = []
    for it in items:
        one.score_batch([it])
        singles += one.last_texts
    assert texts == singles  # greedy decoding is the same with left padding
    for r, t in zip(res, texts):
        v = parse_score(t)
        assert (r.score, r.parsed) == ((v, True) if v is not None else (50.0, False))


def test_prompt_self_ensemble_and_cot_parse(tiny_vlms, monkeypatch):
    items = _items(1)[:2]
    det = _det(tiny_vlms["llava"], mode="prompt", self_ensemble=3, cot=True, max_new_tokens=4)
    replies = ['{"score": 80}', "Score: 60/100", "garbled", "nothing", "still nothing", "?"]
    calls = {}

    def fake_decode(ids, **kw):
        calls["rows"] = ids.shape[0]
        return replies

    monkeypatch.setattr(det.tokenizer, "batch_decode", fake_decode)
    res = det.score_batch(items)
    assert calls["rows"] == 6  # 3 samples per item
    assert (res[0].score, res[0].parsed) == (70.0, True)
    assert (res[1].score, res[1].parsed) == (50.0, False)
    assert "two or three" in det._head


def test_localize_parses_marked_spans(tiny_vlms, monkeypatch):
    items = _items(1)[:2]  # "a red dog is sitting on the grass.", "the cat is next to a kid in the park."
    det = _det(tiny_vlms["qwen2-vl"], mode="localize", max_new_tokens=4)
    assert det.localizes
    replies = ['```json\n{"output": "a **[red dog]** is sitting on the grass."}\n```', "the cat is next to a kid."]
    monkeypatch.setattr(det.tokenizer, "batch_decode", lambda ids, **kw: replies)
    res = det.score_batch(items)
    assert res[0].spans == [[1, 3]] and res[0].score == 0.0 and res[0].parsed
    assert res[1].spans == [] and res[1].score == 100.0


def test_context_option_uses_table_d_text(tiny_vlms):
    items = _items(1)
    det = _det(tiny_vlms["llava"], context=True)
    text = det.tokenizer.decode(det.continuation_ids(items[1]))
    assert text.startswith(" a red dog is sitting on the grass. the cat is next to a kid in the park. "
                           "Think about the correctness of **the cat is next to a kid in the park.**")
    no_ctx = _det(tiny_vlms["llava"])
    assert no_ctx.tokenizer.decode(no_ctx.continuation_ids(items[1])).startswith(" the cat is next")
    assert det.score_batch(items)[1].score != pytest.approx(no_ctx.score_batch(items)[1].score, abs=1e-6)


def test_spec_options_and_trust_remote_code_default(tiny_vlms, monkeypatch):
    import transformers

    from halsift.filtering.detectors.spec import SpecError, load_detector

    seen = []
    orig = transformers.AutoModelForImageTextToText.from_pretrained.__func__

    def spy(cls, *a, **kw):
        seen.append(kw.get("trust_remote_code"))
        return orig(cls, *a, **kw)

    monkeypatch.setattr(transformers.AutoModelForImageTextToText, "from_pretrained", classmethod(spy))
    det = load_detector(f"vlm:model={tiny_vlms['llava']},mode=yes_prob,dtype=float32")
    assert det.spec.startswith("vlm:") and "mode=yes_prob" in det.spec
    words = det.tokenizer.batch_decode([[i] for i in det.yes_ids + det.no_ids])
    assert {w.strip().lower() for w in words} == {"yes", "no"} and det.yes_ids and det.no_ids
    load_detector({"family": "vlm", "model": str(tiny_vlms["llava"]), "trust_remote_code": True})
    assert seen == [False, True]
    with pytest.raises(SpecError, match="mode"):
        load_detector(f"vlm:model={tiny_vlms['llava']},mode=bogus")
    with pytest.raises(SpecError, match="cot=true needs mode=prompt"):
        load_detector(f"vlm:model={tiny_vlms['llava']},cot=true")
    with pytest.raises(SpecError, match="unknown option"):
        load_detector(f"vlm:model={tiny_vlms['llava']},top_k=2")
    with pytest.raises(SpecError, match="temperature=2: only used with mode=pmi"):
        load_detector(f"vlm:model={tiny_vlms['llava']},temperature=2")


def test_sentence_loglik_and_own_vs_random(tiny_vlms):
    from halsift.filtering.detectors.vlm_likelihood import own_vs_random, sentence_logliks
    from vlm_reference import reference_loglik

    det = _det(tiny_vlms["qwen2-vl"])
    items = _items()
    got = sentence_logliks(det, items, batch_size=5)
    it = items[1]  # independently: one unpadded sequence, mean log-prob of the sentence tokens
    assert it.context
    expected = reference_loglik(det, it.image, it.context, it.sentence)
    assert got[1] == pytest.approx(expected, abs=1e-4)
    res = own_vs_random(det, items, seed=0)
    assert res["likelihood/own/all"] == pytest.approx(sum(got) / len(got), abs=1e-4)
    assert {"likelihood/gap/pos0", "likelihood/gap/pos1", "likelihood/gap/pos3"} <= set(res)
    assert res["likelihood/random/all"] != pytest.approx(res["likelihood/own/all"], abs=1e-6)


@pytest.mark.parametrize("arch", ["qwen2-vl", "llava"])
def test_pmi_mode_scores_image_pmi_against_references(tiny_vlms, tmp_path, arch):
    """``mode=pmi`` with one reference: score = 100·sigmoid(n_tokens · (mean log-lik given the own image − given
    the reference) / temperature), from the independently tested ``sentence_logliks``; the own image as reference
    gives 50."""
    import math

    from halsift.filtering.detectors.spec import load_detector
    from halsift.filtering.detectors.vlm_likelihood import sentence_logliks

    items = _items()
    ref = Image.new("RGB", (70, 60), (10, 30, 220))
    (tmp_path / "refs").mkdir()
    ref.save(tmp_path / "refs" / "a.png")
    (tmp_path / "refs" / "notes.txt").write_text("not an image")
    det = load_detector(f"vlm:model={tiny_vlms[arch]},mode=pmi,references={tmp_path / 'refs'},n_references=1,"
                        "temperature=2,dtype=float32,device=cpu,forward_batch=4")
    got = [r.score for r in det.score_batch(items)]
    own = sentence_logliks(det, items)
    swapped = [Item(it.key, it.sentence_index, it.sentence, it.context, ref, "ref") for it in items]
    other = sentence_logliks(det, swapped)
    n_tok = [len(det.tokenizer((" " if it.context else "") + it.sentence, add_special_tokens=False)["input_ids"])
             for it in items]
    expected = [100 / (1 + math.exp(-n * (o - r) / 2)) for n, o, r in zip(n_tok, own, other)]
    assert got == pytest.approx(expected, abs=1e-3)
    assert len({round(x, 3) for x in got}) > 1
    first = items[0].image  # the reference is the image itself: no information, PMI 0
    first.save(tmp_path / "refs" / "0.png")  # sorts before a.png
    same = load_detector(f"vlm:model={tiny_vlms[arch]},mode=pmi,references={tmp_path / 'refs'},n_references=1,"
                         "dtype=float32,device=cpu")
    assert [r.score for r in same.score_batch(items[:2])] == pytest.approx([50.0, 50.0], abs=1e-3)


def test_token_logprobs_one_pass_per_caption_equals_one_pass_per_sentence(tiny_vlms):
    """Sentences of a caption are read off one sequence; bench-style items (a distinct key per row, two captions
    of one image, shuffled order, a caption split across calls) get what scoring each alone gives."""
    from halsift.filtering.detectors.vlm_likelihood import _chains, describe_prefix, token_logprobs

    det = _det(tiny_vlms["llava"])
    img = Image.new("RGB", (60, 60), (200, 30, 30))
    caps = [["a red dog sits.", "it is small.", "a tree stands behind it."], ["two cats.", "one sleeps."]]
    items = [Item(f"row{c}-{i}", i, s, cap[:i], img, "im") for c, cap in enumerate(caps) for i, s in enumerate(cap)]
    items = [items[k] for k in (3, 1, 0, 4, 2)]
    pre = describe_prefix(det.processor, img)
    assert len(_chains(items, [pre] * len(items))) == 2
    together = token_logprobs(det, items, [pre] * len(items), batch_size=1)
    alone = [token_logprobs(det, [it], [pre])[0] for it in items]
    for a, b in zip(together, alone):
        assert a.shape == b.shape and len(a) > 0
        assert torch.allclose(torch.from_numpy(a), torch.from_numpy(b), atol=1e-4)


def test_pmi_references_from_shards_and_errors(tiny_vlms, synth_world, tmp_path):
    from halsift.filtering.detectors.spec import SpecError, load_detector
    from halsift.filtering.detectors.vlm_likelihood import reference_images

    imgs = reference_images(str(synth_world / "pretrain"), 3)
    assert len(imgs) == 3 and all(im.mode == "RGB" for im in imgs)
    model = tiny_vlms["llava"]
    with pytest.raises(SpecError, match="mode=pmi needs references"):
        load_detector(f"vlm:model={model},mode=pmi")
    with pytest.raises(SpecError, match="only used with mode=pmi"):
        load_detector(f"vlm:model={model},mode=yes_prob,references={synth_world / 'pretrain'}")
    with pytest.raises(SpecError, match=f"references={tmp_path / 'nope'}: no such folder"):
        load_detector(f"vlm:model={model},mode=pmi,references={tmp_path / 'nope'}")
    (tmp_path / "one").mkdir()
    Image.new("RGB", (40, 40)).save(tmp_path / "one" / "x.png")
    (tmp_path / "one" / "y.png").write_bytes(b"corrupt")
    with pytest.raises(SpecError, match="temperature"):
        load_detector(f"vlm:model={model},mode=pmi,references={synth_world / 'pretrain'},temperature=0")
    with pytest.raises(SpecError, match="needs 2 decodable images \\(n_references\\), found 1"):
        load_detector(f"vlm:model={model},mode=pmi,references={tmp_path / 'one'},n_references=2")


def test_from_model_wraps_in_memory_model(tiny_vlms):
    from halsift.filtering.detectors.vlm import VlmDetector

    loaded = _det(tiny_vlms["llava"], mode="yes_prob")
    wrapped = VlmDetector.from_model(loaded.model, loaded.processor, mode="yes_prob", reuse_prefix=False)
    items = _items(2)
    assert [r.score for r in wrapped.score_batch(items)] == pytest.approx([r.score for r in loaded.score_batch(items)],
                                                                          abs=1e-3)
    with pytest.raises(ValueError, match="mode"):
        VlmDetector.from_model(loaded.model, loaded.processor, mode="nope")


def test_tiny_tokenizer_extra_text_makes_whole_words():
    """``extra_text`` (a world's captions) turns its words into single tokens; without it nothing changes."""
    from halsift.synth.tiny_vlm import _tokenizer

    plain = _tokenizer("llava", 600)
    world = _tokenizer("llava", 1024, ["Three small purple hexagons face downward."] * 20)
    assert len(plain.tokenize(" hexagons")) > 1 and world.tokenize(" hexagons") == ["Ġhexagons"]
    assert plain.get_vocab() == _tokenizer("llava", 600, ()).get_vocab()


@pytest.mark.parametrize("arch", ARCHS)
def test_encoded_reference_prefix_gives_the_uncached_log_probs(tiny_vlms, arch):
    """PMI references are encoded once (:class:`EncodedPrefix`) and every caption reuses their KV cache: the
    per-token log-probabilities equal a full pass per caption, for captions of different lengths in one batch
    (right padding), in batches of 1 and 4, and the stored cache stays the prefix after use."""
    from halsift.filtering.detectors.vlm_likelihood import EncodedPrefix, cached_token_logprobs, describe_prefix, token_logprobs

    det = _det(tiny_vlms[arch])
    items = _items(3)
    ref = describe_prefix(det.processor, Image.new("RGB", (64, 48), (10, 30, 220)))
    full = token_logprobs(det, items, [ref] * len(items), batch_size=4)
    enc = EncodedPrefix(det, ref)
    for bs in (1, 4):
        cached = cached_token_logprobs(det, items, enc, batch_size=bs)
        for a, b in zip(cached, full):
            assert a.shape == b.shape and len(a) > 0
            assert torch.allclose(torch.from_numpy(a), torch.from_numpy(b), atol=2e-4), (arch, bs)
    assert enc.cache.get_seq_length() == enc.length


def test_caption_chunks_never_split_a_caption_that_fits():
    from halsift.filtering.detectors.vlm import caption_chunks

    img = [Image.new("RGB", (8, 8)) for _ in range(4)]
    sizes = [3, 2, 5, 1]  # sentences per caption
    items = [Item(f"k{c}", i, "s.", [], img[c], f"i{c}") for c, n in enumerate(sizes) for i in range(n)]
    chunks = caption_chunks(items, 4)
    assert [it for c in chunks for it in c] == items  # order and content kept
    assert all(len(c) <= 4 for c in chunks)
    assert [[it.image_id for it in c] for c in chunks] == [
        ["i0"] * 3, ["i1"] * 2, ["i2"] * 4, ["i2"], ["i3"]]  # only the 5-sentence caption is split


def test_max_pixels_caps_the_image_the_processor_sees(tiny_vlms):
    from halsift.filtering.detectors.vlm import cap_pixels

    big = Image.new("RGB", (1024, 768))
    small = cap_pixels(big, 512 * 28 * 28)
    assert small.width * small.height <= 512 * 28 * 28 and abs(small.width / small.height - 4 / 3) < 0.01
    assert cap_pixels(big, 0) is big and cap_pixels(small, 512 * 28 * 28) is small
    capped, uncapped = _det(tiny_vlms["qwen2-vl"], max_pixels=56 * 56), _det(tiny_vlms["qwen2-vl"], max_pixels=0)
    n = lambda det: int(det.prefix_inputs(Image.new("RGB", (448, 448)))["input_ids"].shape[1])  # noqa: E731
    assert n(capped) < n(uncapped)
    with pytest.raises(ValueError, match="max_pixels=-1"):
        _det(tiny_vlms["qwen2-vl"], max_pixels=-1)


@pytest.mark.parametrize("arch", ["qwen2-vl", "gemma3"])
def test_prefix_reuse_passes_the_cache_by_the_models_own_name(tiny_vlms, arch):
    """transformers 5.2x renamed the KV-cache argument to ``cache`` and warns on every call given the old name (a
    flood in a corpus run): the cached continuation uses whichever name the model's forward takes."""
    import inspect
    import warnings

    from halsift.filtering.detectors.vlm_judge import cache_argument

    det = _det(tiny_vlms[arch], reuse_prefix=True, forward_batch=16)
    model = det.judge.model if hasattr(det, "judge") else det.model
    params = inspect.signature(model.forward).parameters
    assert cache_argument(model) == ("cache" if "cache" in params else "past_key_values")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        scores = det.score_batch(_items())
    assert all(r.parsed for r in scores)
    assert not [w for w in seen if "past_key_values" in str(w.message)], [str(w.message) for w in seen]


@pytest.mark.parametrize("arch", ARCHS)
def test_features_after_the_first_image_of_a_size_are_the_whole_processors(tiny_vlms, arch):
    """The judge keeps each (prompt, image size)'s text half and runs only the image half for the next images of
    that size: every feature equal to the whole processor's, for two sizes and colours; the split is used (for the
    processors whose image half stands alone) and never shares a tensor between two calls."""
    from halsift.filtering.detectors.vlm_judge import chat_text, text_features

    judge = _det(tiny_vlms[arch], mode="yes_prob").judge
    text = chat_text(judge.processor, "Is the caption correct?")
    images = [Image.new("RGB", size, colour) for colour in ((200, 10, 10), (10, 200, 90), (30, 30, 220))
              for size in ((56, 56), (84, 70))]
    for image in images:
        got, want = judge.features(text, image), text_features(judge.processor, text, judge.fit_image(image))
        assert got.keys() == want.keys()
        assert all(torch.equal(got[k], want[k]) for k in want), arch
    halves = {size: judge._halves[(text, size)] for size in ((56, 56), (84, 70))}
    if arch in ("llava", "qwen2-vl"):
        assert all(h is not False for h in halves.values())  # the fast path ran (4 of the 6 calls)
    a, b = judge.features(text, images[0]), judge.features(text, images[2])
    assert a["input_ids"] is not b["input_ids"]


def test_features_of_a_processor_whose_image_half_differs_stay_whole(tiny_vlms, monkeypatch):
    """When the image half alone does not give what the whole processor gave (here: a half that adds 1), the split
    is refused for that size and every call runs the whole processor."""
    from halsift.filtering.detectors.vlm_judge import VlmJudge, chat_text, text_features

    judge = _det(tiny_vlms["llava"], mode="yes_prob").judge
    real = VlmJudge._image_half
    monkeypatch.setattr(VlmJudge, "_image_half", lambda self, image: {k: v + 1 for k, v in real(self, image).items()})
    text = chat_text(judge.processor, "Is the caption correct?")
    for colour in ((200, 10, 10), (10, 200, 90)):
        image = Image.new("RGB", (56, 56), colour)
        got, want = judge.features(text, image), text_features(judge.processor, text, image)
        assert all(torch.equal(got[k], want[k]) for k in want)
    assert judge._halves[(text, (56, 56))] is False
