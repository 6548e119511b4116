"""Detector interface, spec parsing, and the clip / random / oracle / ensemble detectors."""

from __future__ import annotations

import copy
import re

import numpy as np
import pytest
from PIL import Image
from scipy.stats import rankdata

from halsift.filtering.detectors.base import Item
from halsift.filtering.detectors.baselines import OracleDetector, RandomDetector, hash_uniform
from halsift.filtering.detectors.base import DetectorError
from halsift.filtering.detectors.ensemble import combine, normalise
from halsift.filtering.detectors.spec import SpecError, load_detector, parse_spec


def _items(n_images=3, per=3, labels=("correct", "incorrect", "unknown")):
    rng = np.random.default_rng(0)
    out = []
    for i in range(n_images):
        img = Image.fromarray(rng.integers(0, 255, (40, 40, 3), dtype=np.uint8))
        for j in range(per):
            out.append(Item(f"k{i}", j, f"a photo of thing {i} {j}", [], img, f"img{i}",
                            {"label": labels[(i + j) % len(labels)]}))
    return out


# ------------------------------------------------------------------------------------------- specs
def test_parse_short_specs():
    assert parse_spec("oracle") == ("oracle", {})
    assert parse_spec("random:seed=3") == ("random", {"seed": 3})
    fam, opts = parse_spec("clip:arch=ViT-B-32,pretrained=openai")
    assert fam == "clip" and opts == {"arch": "ViT-B-32", "pretrained": "openai"}
    fam, opts = parse_spec("ensemble:members=[clip:arch=halsift-tiny,pretrained=random,seed=2,random:seed=1,oracle],"
                           "weights=[1,2.5,3],norm=rank")
    assert opts["members"] == ["clip:arch=halsift-tiny,pretrained=random,seed=2", "random:seed=1", "oracle"]
    assert opts["weights"] == [1, 2.5, 3] and opts["norm"] == "rank"
    _, opts = parse_spec("ensemble:members=[random:seed=1;clip:checkpoint=/a/b:c.pt,arch=x]")
    assert opts["members"] == ["random:seed=1", "clip:checkpoint=/a/b:c.pt,arch=x"]


def test_canonical_spec_ignores_option_order():
    a = load_detector("random:seed=4,delay=0")
    b = load_detector("random:delay=0,seed=4")
    assert a.spec == b.spec == "random:delay=0,seed=4"


@pytest.mark.parametrize("spec, needle", [
    ("", "empty"),
    ("nosuch:x=1", "unknown family 'nosuch'"),
    ("random:sed=1", "unknown option 'sed'"),
    ("random:seed", "not key=value"),
    ("random:seed=abc", "seed: expected an integer, got 'abc'"),  # the typed check the dry run runs too
    ("random:seed=1,seed=2", "given twice"),
    ("ensemble:members=[oracle,random:seed=0],weights=[1]", "expected 2 values"),
    ("ensemble:members=[oracle],norm=softmax", "norm='softmax'"),
    ("ensemble:members=[oracle", "unbalanced"),
    ("clip:arch=NoSuchArch", "arch='NoSuchArch'"),
    ("clip:arch=halsift-tiny,pretrained=random,map=cubic", "map='cubic'"),
])
def test_spec_errors_name_key_and_value(spec, needle):
    with pytest.raises(SpecError, match=None) as e:
        load_detector(spec)
    assert needle in str(e.value)


def test_every_detector_option_has_one_line_of_help():
    """Each family's OPTION_HELP names exactly its __init__ options (docs/config.md and --describe show it)."""
    import dataclasses

    from halsift.filtering.detectors.spec import _family_class, families, family_config

    for family in families():
        fields = dataclasses.fields(family_config(family))
        assert all(f.metadata["help"] for f in fields), (family, [f.name for f in fields if not f.metadata["help"]])
        cls = _family_class(family, family)
        assert set(getattr(cls, "OPTION_HELP", {})) == {f.name for f in fields}, family


def test_family_options_are_typed_and_checked_without_importing_the_detector():
    import dataclasses
    import subprocess
    import sys

    from halsift.filtering.detectors.spec import check_spec, family_config

    fields = {f.name: f for f in dataclasses.fields(family_config("vlm"))}
    assert fields["model"].default is dataclasses.MISSING and fields["n_references"].default == 8
    assert fields["temperature"].type == (float | None) and fields["cot"].type is bool
    check_spec("api:base_url=http://localhost:8000/v1,model=2017,timeout=5")  # a number for a text option is text
    for spec, needle in [("clip:seed=1.5", "seed: expected an integer, got 1.5"),
                         ("vlm:model=m,cot=maybe", "cot: expected true/false"),
                         ("api:model=m", "missing option 'base_url' for family 'api'"),
                         ("ensemble:members=[random:seed=1;clip:center=x]", "'clip:center=x': center: expected a number")]:
        with pytest.raises(SpecError, match=re.escape(needle)):
            check_spec(spec)
    code = ("import sys; from halsift.filtering.detectors.spec import check_spec; check_spec('vlm:model=m,seed=1'); "
            "print(sorted(m for m in ('torch', 'transformers', 'open_clip') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "[]"


def test_yaml_spec(tmp_path):
    p = tmp_path / "det.yaml"
    p.write_text("family: ensemble\nmembers: ['random:seed=1', {family: random, seed: 2}]\nweights: [1, 3]\n")
    det = load_detector(p)
    assert [m.seed for m in det.members] == [1, 2] and det.weights == [1.0, 3.0]
    bad = tmp_path / "bad.yaml"
    bad.write_text("seed: 1\n")
    with pytest.raises(SpecError, match="'family' is missing"):
        load_detector(bad)
    with pytest.raises(FileNotFoundError, match=r"^detector spec: .*missing\.yaml does not exist$"):
        load_detector(tmp_path / "missing.yaml")


# ------------------------------------------------------------------------------------------- baselines
def test_random_is_a_function_of_key_and_seed():
    items = _items()
    det = RandomDetector(seed=7)
    full = [r.score for r in det.score_batch(items)]
    one_by_one = [det.score_batch([it])[0].score for it in reversed(items)][::-1]
    assert full == one_by_one
    assert full[0] == pytest.approx(100 * hash_uniform(7, "k0", 0))
    assert all(0 <= s < 100 for s in full) and len(set(full)) == len(full)
    assert full != [r.score for r in RandomDetector(seed=8).score_batch(items)]


def test_oracle_scores_and_errors():
    items = _items()
    res = OracleDetector().score_batch(items)
    want = {"correct": 100.0, "incorrect": 0.0, "unknown": 50.0}
    assert [r.score for r in res] == [want[it.meta["label"]] for it in items]
    with pytest.raises(DetectorError, match="k9 sentence 2 has no ground-truth label"):
        OracleDetector().score_batch([Item("k9", 2, "x")])


# ------------------------------------------------------------------------------------------- ensemble
def test_normalise_and_combine_by_hand():
    a = np.array([10.0, 30.0, 30.0, 90.0])
    b = np.array([80.0, 20.0, 50.0, 0.0])
    # rank: average ranks (1, 2.5, 2.5, 4) -> 100*(r-1)/3
    np.testing.assert_allclose(normalise(a, "rank"), [0, 50, 50, 100])
    z = (a - a.mean()) / a.std()
    np.testing.assert_allclose(normalise(a, "zscore"), np.clip(50 + 50 * z / 3, 0, 100))
    np.testing.assert_allclose(combine(np.stack([a, b]), [1, 3], "none"), (a + 3 * b) / 4)
    rb = 100 * (rankdata(b) - 1) / 3
    np.testing.assert_allclose(combine(np.stack([a, b]), [2, 1], "rank"), (2 * np.array([0, 50, 50, 100]) + rb) / 3)
    np.testing.assert_allclose(normalise(np.array([5.0, 5.0]), "zscore"), [50, 50])


def test_ensemble_detector_weighted_mean():
    items = _items()
    det = load_detector("ensemble:members=[oracle,random:seed=1],weights=[3,1]")
    got = [r.score for r in det.score_batch(items)]
    o = [r.score for r in OracleDetector().score_batch(items)]
    r = [r.score for r in RandomDetector(seed=1).score_batch(items)]
    np.testing.assert_allclose(got, [(3 * x + y) / 4 for x, y in zip(o, r)], rtol=1e-12)


# ------------------------------------------------------------------------------------------- clip
@pytest.fixture(scope="module")
def tiny_clip():
    return load_detector("clip:arch=halsift-tiny,pretrained=random,seed=0")


def test_clip_scores_match_independent_cosine(tiny_clip):
    import torch

    items = _items()
    res = tiny_clip.score_batch(items)
    m = tiny_clip.model
    with torch.no_grad():
        for it, r in zip(items, res):
            img = m.encode_image(tiny_clip.preprocess(it.image)[None])
            txt = m.encode_text(tiny_clip.tokenizer([it.sentence]))
            cos = torch.nn.functional.cosine_similarity(img, txt).item()
            assert r.score == pytest.approx(50 * (cos + 1), abs=1e-3)
            assert r.parsed


def test_clip_encodes_each_image_once(tiny_clip, monkeypatch):
    calls = []
    orig = tiny_clip.model.encode_image
    monkeypatch.setattr(tiny_clip.model, "encode_image", lambda x, **kw: calls.append(len(x)) or orig(x, **kw))
    tiny_clip.score_batch(_items(n_images=3, per=4))
    assert calls == [3]


def test_clip_text_runs_on_the_used_positions_only_with_identical_embeddings(tiny_clip, monkeypatch):
    """Padding is cut to the batch's longest sentence (causal text tower, end-of-text pooling): the same embeddings
    as open_clip's full 77-position pass up to float rounding; a tower without a causal mask gets the full pass."""
    import torch

    from halsift.filtering.detectors import clip as clip_detector

    m = tiny_clip.model
    # A tower without a causal mask (e.g. SigLIP-style: every token attends to the padding), on a copy: the fixture's
    # model is shared by the module, and its mask is a buffer (in `_buffers`, which monkeypatch cannot restore).
    maskless = copy.deepcopy(m)
    maskless.attn_mask = None
    tok = tiny_clip.tokenizer(["A small red circle is in the top left corner.", "Two blue stars.", "x"])
    seen = []
    orig = m.transformer.forward
    monkeypatch.setattr(m.transformer, "forward", lambda x, **kw: seen.append(x.shape[1]) or orig(x, **kw))
    with torch.no_grad():
        full = m.encode_text(tok)
        cut = clip_detector.encode_text(m, tok)
    used = int((tok != 0).any(0).nonzero().max()) + 1
    assert seen == [77, used] and used < 20
    torch.testing.assert_close(cut, full, rtol=0, atol=1e-5)
    orig_copy = maskless.transformer.forward
    maskless.transformer.forward = lambda x, **kw: seen.append(x.shape[1]) or orig_copy(x, **kw)
    seen.clear()
    with torch.no_grad():
        clip_detector.encode_text(maskless, tok)
    assert seen == [77]
    assert m.attn_mask is not None  # the shared model keeps its causal mask


def test_clip_random_init_is_seeded_and_batch_independent(tiny_clip):
    items = _items()
    a = [r.score for r in tiny_clip.score_batch(items)]
    again = load_detector("clip:arch=halsift-tiny,pretrained=random,seed=0")
    b = [r.score for r in again.score_batch(items[::-1])][::-1]
    c = [r.score for r in load_detector("clip:arch=halsift-tiny,pretrained=random,seed=1").score_batch(items)]
    np.testing.assert_allclose(a, b, atol=1e-4)
    assert not np.allclose(a, c, atol=1e-3)


def test_clip_precision_auto_is_fp32_on_cpu_and_explicit_bf16_is_honoured(tiny_clip):
    import torch

    assert next(tiny_clip.model.parameters()).dtype == torch.float32  # auto, on the CPU
    half = load_detector("clip:arch=halsift-tiny,pretrained=random,seed=0,precision=bf16")
    assert next(half.model.parameters()).dtype == torch.bfloat16
    a = np.array([r.score for r in tiny_clip.score_batch(_items())])
    b = np.array([r.score for r in half.score_batch(_items())])
    np.testing.assert_allclose(a, b, atol=1.0)  # same scores to bf16 rounding


@pytest.mark.gpu
def test_clip_precision_auto_is_bf16_on_cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    det = load_detector("clip:arch=halsift-tiny,pretrained=random,seed=0,device=cuda")
    assert next(det.model.parameters()).dtype == torch.bfloat16 and torch.backends.cuda.matmul.allow_tf32


def test_clip_checkpoint_and_from_model(tiny_clip, tmp_path):
    import open_clip
    from safetensors.torch import save_file

    from halsift.filtering.detectors.clip import ClipDetector

    path = tmp_path / "m.safetensors"
    save_file({k: v.contiguous() for k, v in tiny_clip.model.state_dict().items()}, str(path))
    loaded = load_detector(f"clip:arch=halsift-tiny,seed=5,checkpoint={path}")
    items = _items()
    want = [r.score for r in tiny_clip.score_batch(items)]
    np.testing.assert_allclose([r.score for r in loaded.score_batch(items)], want, atol=1e-4)
    mem = ClipDetector.from_model(tiny_clip.model, tiny_clip.preprocess, open_clip.get_tokenizer("halsift-tiny"))
    np.testing.assert_allclose([r.score for r in mem.score_batch(items)], want, atol=1e-4)
    with pytest.raises(SpecError, match="does not exist"):
        load_detector(f"clip:arch=halsift-tiny,checkpoint={tmp_path / 'nope.safetensors'}")


def test_clip_sigmoid_map(tiny_clip):
    import torch

    det = load_detector("clip:arch=halsift-tiny,pretrained=random,map=sigmoid,center=0.1")
    items = _items(n_images=1, per=2)
    cos = det.cosines(items)
    scale = det.model.logit_scale.exp().item()
    want = 100 * torch.sigmoid(scale * (cos - 0.1))
    np.testing.assert_allclose([r.score for r in det.score_batch(items)], want.numpy(), atol=1e-4)


def test_siglip_checkpoint_loads_through_every_loader(tmp_path):
    """A SigLIP-loss fine-tune stores ``logit_bias``, which halsift-tiny lacks: the detector (``clip:checkpoint=``),
    training's ``load_model`` and the shared ``load_open_clip`` (recipe eval, world judge tower) all load it."""
    import open_clip
    import torch

    from halsift.filtering.models.clip_models import load_open_clip, register_builtin_configs
    from halsift.training.clip_train import load_model, save_state_dict_safetensors

    register_builtin_configs()
    trained = open_clip.create_model("halsift-tiny", init_logit_bias=-3.5)
    ckpt = tmp_path / "siglip.safetensors"
    save_state_dict_safetensors(trained, ckpt)
    det = load_detector(f"clip:arch=halsift-tiny,checkpoint={ckpt}")
    for model in (det.model, load_model("halsift-tiny", str(ckpt))[0], load_open_clip("halsift-tiny", str(ckpt))[0]):
        assert float(model.logit_bias) == pytest.approx(-3.5)
        assert torch.equal(model.visual.conv1.weight.float(), trained.visual.conv1.weight)


def test_clip_prepare_then_score_prepared_equals_score_batch(tiny_clip, tmp_path):
    """The runner runs ``prepare`` (preprocessing, tokenization) in its read-ahead thread and ``score_prepared`` on
    the model: the same scores as ``score_batch``."""
    from halsift.filtering.detectors.base import Detector

    items = _items(n_images=3, per=4)
    direct = [r.score for r in tiny_clip.score_batch(items)]
    prep = tiny_clip.prepare(items)
    assert prep["pixels"].shape[0] == 3 and len(prep["rows"]) == len(items)
    assert [r.score for r in tiny_clip.score_prepared(items, prep)] == direct
    assert Detector().prepare(items) is None  # a detector without a CPU half is scored by score_batch
