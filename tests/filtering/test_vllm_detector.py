"""The ``vllm`` detector against a FAKE of vLLM's offline API: vLLM cannot be installed on the CPU test machine, so a
``vllm`` module is injected into ``sys.modules`` with the call surface the detector uses, shaped as vLLM's own
objects (vllm/outputs.py, vllm/logprobs.py, vllm/sampling_params.py): ``LLM(**engine_kwargs)``,
``LLM.generate(prompts, sampling_params, use_tqdm=False)`` -> ``RequestOutput`` with ``.outputs[0]`` a
``CompletionOutput`` (``.text``, ``.token_ids``, ``.finish_reason``, ``.logprobs``: one ``{token_id: Logprob}`` per
generated position, ``Logprob(logprob, rank, decoded_token)``), ``SamplingParams`` and
``sampling_params.StructuredOutputsParams``. The fake records every call and answers deterministically from
(image uuid, prompt); one variant computes the answer with the tiny transformers VLM itself, to check that both
judges give the same score definition. Nothing here runs vLLM: the real engine is exercised by ``gpu`` tests and
``benchmarks/judge_throughput.py --vllm`` on a GPU machine."""

from __future__ import annotations

import hashlib
import math
import sys
import types
from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from PIL import Image  # noqa: E402

from halsift.filtering.detectors.base import Item  # noqa: E402
from halsift.filtering.detectors.spec import SpecError, check_spec, load_detector  # noqa: E402
from halsift.filtering.detectors.vllm_judge import (SCORE_REGEX, expected_number, split_point,  # noqa: E402
                                                    yes_no_score)


# ---------------------------------------------------------------------------------------------- the fake API
@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = "stop"


@dataclass
class RequestOutput:
    request_id: str
    prompt: str
    prompt_token_ids: list[int] | None
    prompt_logprobs: None
    outputs: list[CompletionOutput]
    finished: bool = True


@dataclass
class StructuredOutputsParams:
    json: str | None = None
    regex: str | None = None
    choice: list[str] | None = None


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    max_tokens: int | None = 16
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    logprob_token_ids: list[int] | None = None
    structured_outputs: StructuredOutputsParams | None = None


@dataclass
class OldSamplingParams:  # a vLLM without logprob_token_ids
    n: int = 1
    temperature: float = 1.0
    max_tokens: int | None = 16
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    structured_outputs: StructuredOutputsParams | None = None


def _unit(*parts: str) -> float:
    """A deterministic number in [0, 1) from text."""
    return int(hashlib.sha256("|".join(parts).encode()).hexdigest()[:8], 16) / 2**32


@dataclass
class Record:
    engines: list[dict] = field(default_factory=list)
    calls: list[tuple[list[dict], object]] = field(default_factory=list)


class FakeLLM:
    """Answers from (image uuid, prompt): a log-probability per requested token id (or the top ``logprobs`` ids of a
    fixed vocabulary of 40), or the text ``{"score": N}`` (``garbled`` for a prompt holding "bird")."""

    record = Record()
    fail_when = None  # a function of one prompt dict -> exception to raise for a call that holds it

    def __init__(self, **kwargs) -> None:
        self.record.engines.append(kwargs)

    def logprob(self, prompt: dict, tid: int) -> float:
        return math.log(0.01 + 0.5 * _unit(prompt["multi_modal_uuids"]["image"], prompt["prompt"], str(tid)))

    def generate(self, prompts, sampling_params, use_tqdm=True):
        for p in prompts:
            err = self.fail_when(p) if self.fail_when else None
            if err is not None:
                raise err
        self.record.calls.append((list(prompts), sampling_params))
        out = []
        for n, p in enumerate(prompts):
            if sampling_params.max_tokens == 1:
                ids = getattr(sampling_params, "logprob_token_ids", None) or range(40)
                pos = {t: Logprob(self.logprob(p, t)) for t in ids}
                if not getattr(sampling_params, "logprob_token_ids", None):
                    top = sorted(pos, key=lambda t: -pos[t].logprob)[:sampling_params.logprobs]
                    pos = {t: Logprob(pos[t].logprob, r + 1) for r, t in enumerate(top)}
                text, lps = "", [pos]
            else:
                text = "garbled" if "bird" in p["prompt"] else '{"score": %d}' % int(100 * _unit(p["prompt"]))
                lps = None
            out.append(RequestOutput(str(n), p["prompt"], None, None, [CompletionOutput(0, text, [], None, lps)]))
        return out


@pytest.fixture
def fake_vllm(monkeypatch):
    """Inject the fake ``vllm`` (and ``vllm.sampling_params``); returns the module (``LLM.record`` holds calls)."""
    FakeLLM.record, FakeLLM.fail_when = Record(), None
    sp = types.ModuleType("vllm.sampling_params")
    sp.StructuredOutputsParams, sp.SamplingParams = StructuredOutputsParams, SamplingParams
    mod = types.ModuleType("vllm")
    mod.LLM, mod.SamplingParams, mod.sampling_params = FakeLLM, SamplingParams, sp
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", sp)
    return mod


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory):
    from halsift.synth.tiny_vlm import build_tiny_vlm

    return build_tiny_vlm("qwen2-vl", tmp_path_factory.mktemp("vllm_vlm") / "qwen", seed=0, init_std=0.5)


def _image(g: int) -> Image.Image:
    return Image.new("RGB", (56 + 14 * g, 56 + 7 * g), (40 * g % 255, 200 - 30 * g, 90))


def _items() -> list[Item]:
    """Three captions; caption 2 has the pixels of caption 0 in another image object and key."""
    sents = ["a red dog is sitting on the grass.", "the cat is next to a kid.", "two birds fly.", "a sign reads stop."]
    items = []
    for g, pix in enumerate([0, 1, 0]):
        img = _image(pix)
        caption = sents[g:g + 2 + g % 2]
        items += [Item(f"k{g}", i, s, caption[:i], img, f"img{g}") for i, s in enumerate(caption)]
    return items


def _yes_no(det):
    return set(det.yes_ids), set(det.no_ids)


# ---------------------------------------------------------------------------------------------- tests
def test_requests_grouped_by_image_prefix_first_and_one_uuid_per_content(fake_vllm, tiny_vlm):
    det = load_detector(f"vllm:model={tiny_vlm}")
    items = _items()
    shuffled = [items[i] for i in (3, 0, 5, 1, 4, 2, 6)]  # images interleaved
    results = det.score_batch(shuffled)
    (prompts, params), = FakeLLM.record.calls  # one generate call for the batch
    groups = [p["multi_modal_uuids"]["image"] for p in prompts]
    # grouped by image object, in first-appearance order: k1 (its 3 items) then k0 then k2
    keys = [shuffled[i].key for i in det.prepare(shuffled)["order"]]
    assert keys == ["k1", "k1", "k1", "k0", "k0", "k2", "k2"]
    assert groups[:3] == [groups[0]] * 3 and groups[3] != groups[0]
    assert groups[3] == groups[5], "captions 0 and 2 have the same pixels: one uuid for one content"
    assert len(set(groups)) == 2
    for p, i in zip(prompts, det.prepare(shuffled)["order"]):
        text, sentence = p["prompt"], shuffled[i].sentence.strip()
        assert text.index("<|image_pad|>") < text.index("Does this figure show") < text.index(sentence)
        head = text[:text.index('show "') + 6]
        assert text == head + sentence + text[len(head) + len(sentence):]  # only the sentence follows the head
        assert p["multi_modal_data"]["image"].size == shuffled[i].image.size
    assert len({p["prompt"][:p["prompt"].index('show "')] for p in prompts}) == 1  # one shared instruction prefix
    assert params.max_tokens == 1 and params.temperature == 0.0 and params.prompt_logprobs is None
    yes, no = _yes_no(det)
    assert set(params.logprob_token_ids) == yes | no and params.logprobs is None
    engine, = FakeLLM.record.engines
    assert engine["enable_prefix_caching"] is True and engine["limit_mm_per_prompt"] == {"image": 1}
    assert engine["mm_processor_kwargs"] == {"max_pixels": 512 * 28 * 28} and engine["trust_remote_code"] is False
    # the score: yes variants summed against no variants, from the fake's log-probabilities
    for res, p in zip([results[i] for i in det.prepare(shuffled)["order"]], prompts):
        py = sum(math.exp(FakeLLM().logprob(p, t)) for t in yes)
        pn = sum(math.exp(FakeLLM().logprob(p, t)) for t in no)
        assert res.parsed and res.score == pytest.approx(100 * py / (py + pn), rel=1e-12)


def test_yes_no_variants_summed_and_top_k_fallback(fake_vllm, tiny_vlm, monkeypatch):
    pos = {3: Logprob(math.log(0.3)), 4: Logprob(math.log(0.1)), 7: Logprob(math.log(0.2)), 9: Logprob(math.log(0.4))}
    r = yes_no_score(pos, yes=[3, 4], no=[7, 8])
    assert r.parsed and r.score == pytest.approx(100 * 0.4 / 0.6)
    assert yes_no_score({9: Logprob(0.0)}, yes=[3], no=[7]) .parsed is False
    # a vLLM without logprob_token_ids: the top-k alternatives are read instead
    monkeypatch.setattr(fake_vllm, "SamplingParams", OldSamplingParams)
    det = load_detector(f"vllm:model={tiny_vlm},top_logprobs=5")
    items = _items()
    results = det.score_batch(items)
    (prompts, params), = FakeLLM.record.calls
    assert params.logprobs == 5 and not hasattr(params, "logprob_token_ids")
    assert FakeLLM.record.engines[0]["max_logprobs"] == 20
    yes, no = _yes_no(det)
    for i, p in zip(det.prepare(items)["order"], prompts):
        lp = {t: FakeLLM().logprob(p, t) for t in range(40)}
        top = sorted(lp, key=lambda t: -lp[t])[:5]
        py, pn = (sum(math.exp(lp[t]) for t in top if t in s) for s in (yes, no))
        assert results[i].parsed == (py + pn > 0)
        assert results[i].score == pytest.approx(100 * py / (py + pn) if py + pn else 50.0)


def test_prompt_mode_structured_output_and_parse_failures_counted(fake_vllm, tiny_vlm):
    det = load_detector(f"vllm:model={tiny_vlm},mode=prompt,context=true")
    items = _items()
    results = det.score_batch(items)
    (prompts, params), = FakeLLM.record.calls
    assert params.structured_outputs.regex == SCORE_REGEX and params.temperature == 0.0 and params.max_tokens == 12
    for i, p in zip(det.prepare(items)["order"], prompts):
        it = items[i]
        assert p["prompt"].index("Judge the correctness") < p["prompt"].index(it.sentence.strip())
        if it.context:  # Table D: the preceding sentences, then the target
            assert p["prompt"].index(it.context[0].strip()) < p["prompt"].index("**" + it.sentence.strip())
        if "bird" in p["prompt"]:
            assert not results[i].parsed and results[i].score == 50.0
        else:
            assert results[i].parsed and results[i].score == int(100 * _unit(p["prompt"]))
    assert sum(not r.parsed for r in results) == sum("bird" in p["prompt"] for p in prompts) >= 1


@pytest.mark.parametrize("mode", ["yes_prob", "logits"])
def test_same_score_definition_as_the_transformers_judge(fake_vllm, tiny_vlm, mode):
    """A fake engine that computes the first position's log-probabilities with the tiny VLM itself, on the prompt
    (text, or token ids) and image the vllm detector sends: the scores equal ``vlm:mode=MODE``'s (the tiny
    tokenizer splits numbers into digits, so ``logits`` takes the three-request digit path)."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = AutoModelForImageTextToText.from_pretrained(str(tiny_vlm), dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(str(tiny_vlm))
    pad = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")

    def logprob_table(p):
        text = p.get("prompt") or processor.tokenizer.decode(p["prompt_token_ids"])
        feats = processor(text=[text], images=[p["multi_modal_data"]["image"]], return_tensors="pt",
                          add_special_tokens=False)
        if "prompt_token_ids" in p:  # the ids the detector sent, once the image placeholder is expanded
            ids = feats["input_ids"][0].tolist()
            assert [t for j, t in enumerate(ids) if t != pad or ids[j - 1] != pad] == p["prompt_token_ids"]
        with torch.inference_mode():
            return model(**feats).logits[0, -1].float().log_softmax(-1)

    def generate(self, prompts, sampling_params, use_tqdm=True):
        self.record.calls.append((list(prompts), sampling_params))
        out = []
        for p in prompts:
            lp = logprob_table(p)
            pos = {t: Logprob(float(lp[t])) for t in sampling_params.logprob_token_ids}
            out.append(RequestOutput("0", p.get("prompt"), None, None, [CompletionOutput(0, "", [], None, [pos])]))
        return out

    fake_vllm.LLM = type("ModelLLM", (FakeLLM,), {"generate": generate})
    items = _items()
    det = load_detector(f"vllm:model={tiny_vlm},mode={mode}")
    ours = [r.score for r in det.score_batch(items)]
    theirs = [r.score for r in load_detector(f"vlm:model={tiny_vlm},mode={mode},dtype=float32,device=cpu")
              .score_batch(items)]
    assert max(abs(a - b) for a, b in zip(ours, theirs)) < 1e-3
    assert max(theirs) - min(theirs) > 1  # the scores spread: the comparison can fail
    (prompts, _), = FakeLLM.record.calls
    assert len(prompts) == len(items) * (3 if mode == "logits" else 1)
    if mode == "logits":
        assert det.number_mode == "digits"
        base = prompts[0]["prompt_token_ids"]
        assert [p["prompt_token_ids"] for p in prompts[:3]] == [base, base + det.force[:1], base + det.force]


def test_engine_failure_rebuilds_and_isolates_the_input(fake_vllm, tiny_vlm):
    det = load_detector(f"vllm:model={tiny_vlm}")
    items = _items()
    clean = det.score_batch(items)
    FakeLLM.record.calls.clear()
    FakeLLM.fail_when = staticmethod(lambda p: RuntimeError("CUDA out of memory") if "dog" in p["prompt"] else None)
    with pytest.warns(UserWarning, match=r"request for k0#0 failed alone \(RuntimeError"):
        results = det.score_batch(items)
    bad = [i for i, it in enumerate(items) if "dog" in it.sentence]
    assert bad == [0] and not results[0].parsed and results[0].score == 50.0
    assert [r.score for i, r in enumerate(results) if i not in bad] == [r.score for i, r in enumerate(clean)
                                                                      if i not in bad]
    assert det.failed_requests == 1 and det.rebuilds >= 2 and len(FakeLLM.record.engines) == 1 + det.rebuilds
    for prompts, _ in FakeLLM.record.calls:  # the retries split between images first
        uuids = [p["multi_modal_uuids"]["image"] for p in prompts]
        assert len(prompts) == 1 or uuids == sorted(uuids, key=uuids.index)
    # a refused input (ValueError) leaves the engine alive: no rebuild
    FakeLLM.fail_when = staticmethod(lambda p: ValueError("prompt too long") if "dog" in p["prompt"] else None)
    before = det.rebuilds
    with pytest.warns(UserWarning, match="prompt too long"):
        det.score_batch(items)
    assert det.rebuilds == before


def test_split_point_prefers_image_boundaries():
    assert split_point(["a", "a", "a", "b"]) == 3
    assert split_point(["a", "b", "b", "b", "b", "c"]) == 1  # equally near the middle: the earlier boundary
    assert split_point(["a", "a", "a", "a"]) == 2


def test_spec_is_checked_without_vllm_and_a_missing_vllm_is_one_line(monkeypatch, tiny_vlm):
    check_spec("vllm:model=m,mode=prompt,context=true,max_pixels=0")
    with pytest.raises(SpecError, match="top_logprobs: expected an integer"):
        check_spec("vllm:model=m,top_logprobs=many")
    with pytest.raises(SpecError, match="unknown option 'reuse_prefix' for family 'vllm'"):
        check_spec("vllm:model=m,reuse_prefix=true")
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(SpecError, match=r"needs vLLM, which is not installed .*pip install 'halsift\[vllm\]'") as e:
        load_detector(f"vllm:model={tiny_vlm}")
    assert "\n" not in str(e.value)


def test_expected_number_single_and_digit_paths():
    ids = {n: [100 + n, 300 + n] for n in range(101)}
    lp = lambda p: Logprob(math.log(p))  # noqa: E731
    r = expected_number([{100 + 20: lp(0.3), 300 + 20: lp(0.1), 100 + 80: lp(0.4), 7: lp(0.2)}], "single", ids)
    assert r.parsed and r.score == pytest.approx((20 * 0.4 + 80 * 0.4) / 0.8)
    # digits: P1 over the digits, Q after "1" (0.5 on "0", 0.2 on "5", the rest ends), R after "10" (0.25 on "0")
    first = {101: lp(0.6), 303: lp(0.2), 7: lp(0.2)}
    q, r0 = {100: lp(0.5), 105: lp(0.2)}, {300: lp(0.25)}
    v1 = 0.3 * 1 + 0.2 * 15 + 0.5 * (0.25 * 100 + 0.75 * 10)
    got = expected_number([first, q, r0], "digits", ids)
    assert got.parsed and got.score == pytest.approx((0.6 * v1 + 0.2 * 34.5) / 0.8)
    assert expected_number([{7: lp(1.0)}, q, r0], "digits", ids).parsed is False


def test_score_cli_with_decode_workers_and_resume(fake_vllm, tiny_vlm, tmp_path):
    """``halsift score`` with the vllm detector: the same parts with and without a decode worker; a rerun after a
    part was removed submits only that part's requests."""
    import pyarrow.parquet as pq
    from filtering_data import make_corpus

    from halsift.launch.cli import main

    data = make_corpus(tmp_path / "data", shards=2, per_shard=3)
    spec = f"vllm:model={tiny_vlm}"
    for out, extra in ((tmp_path / "a", []), (tmp_path / "b", ["--decode-workers", "1"])):
        assert main(["score", "--detector", spec, "--data", str(data), "--out", str(out), "--no-progress",
                     "--batch-size", "4", *extra]) == 0
    parts = sorted(p.name for p in (tmp_path / "a").glob("part-*.parquet"))
    assert len(parts) == 2 and parts == sorted(p.name for p in (tmp_path / "b").glob("part-*.parquet"))
    tables = {n: pq.read_table(tmp_path / "a" / n) for n in parts}
    for name in parts:
        assert tables[name].num_rows > 0 and tables[name].equals(pq.read_table(tmp_path / "b" / name))
    (tmp_path / "a" / parts[1]).unlink()
    FakeLLM.record.calls.clear()
    assert main(["score", "--detector", spec, "--data", str(data), "--out", str(tmp_path / "a"), "--no-progress",
                 "--batch-size", "4"]) == 0
    assert sum(len(p) for p, _ in FakeLLM.record.calls) == tables[parts[1]].num_rows
    assert pq.read_table(tmp_path / "a" / parts[1]).equals(tables[parts[1]])


def test_benchmark_plumbing_on_the_fake(fake_vllm, tiny_vlm):
    """``benchmarks/vllm_judge_bench.measure`` (what judge_throughput.py --vllm runs on a GPU) on the fake: grouped
    rounds submit requests grouped by image, shuffled rounds do not; one figure per mode, count and order."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
    import vllm_judge_bench

    def make(n, seed):
        return [Item(f"c{c}", i, f"sentence {i} of {c}", [], _image(c + seed % 3), f"c{c}-{seed}")
                for c in range(4) for i in range(n)]

    res = vllm_judge_bench.measure(str(tiny_vlm), make, [1, 5], batch_size=20, repeats=1)
    assert sorted(res) == sorted([f"vllm/yes_prob/s{n}/{o}/sentences_per_s" for n in (1, 5)
                                  for o in ("grouped", "shuffled")] + ["vllm/yes_prob/failed_requests"])
    calls = FakeLLM.record.calls
    grouped, shuffled = calls[-2][0], calls[-1][0]  # the s5 rounds: 20 requests each
    runs = lambda ps: 1 + sum(a["multi_modal_uuids"] != b["multi_modal_uuids"] for a, b in zip(ps, ps[1:]))  # noqa
    assert len(grouped) == len(shuffled) == 20 and runs(grouped) == 4 < runs(shuffled)


@pytest.mark.gpu
def test_real_vllm_matches_the_transformers_judge(tiny_vlm):
    """On a GPU machine with vLLM: the real engine on the tiny Qwen2-VL gives the transformers judge's scores."""
    pytest.importorskip("vllm")
    items = _items()
    ours = load_detector(f"vllm:model={tiny_vlm},dtype=float32,max_model_len=2048,gpu_memory_utilization=0.3")
    theirs = load_detector(f"vlm:model={tiny_vlm},mode=yes_prob,dtype=float32,device=cpu")
    a, b = [r.score for r in ours.score_batch(items)], [r.score for r in theirs.score_batch(items)]
    assert max(abs(x - y) for x, y in zip(a, b)) < 0.5, (a, b)


def test_trust_remote_code_only_from_your_own_spec(fake_vllm, tiny_vlm, tmp_path):
    from halsift.filtering.detectors.trust import TrustWarning

    load_detector(f"vllm:model={tiny_vlm},trust_remote_code=true")
    assert FakeLLM.record.engines[-1]["trust_remote_code"] is True
    spec = tmp_path / "judge.yaml"
    spec.write_text(f"family: vllm\nmodel: {tiny_vlm}\ntrust_remote_code: true\n")
    with pytest.warns(TrustWarning, match="trust_remote_code ignored"):
        load_detector(str(spec))
    assert FakeLLM.record.engines[-1]["trust_remote_code"] is False


def test_structured_output_field_of_older_and_newer_vllm():
    from halsift.filtering.detectors.vllm_judge import structured_regex

    @dataclass
    class GuidedDecodingParams:
        regex: str | None = None

    @dataclass
    class OldParams:
        max_tokens: int = 16
        guided_decoding: GuidedDecodingParams | None = None

    new = types.SimpleNamespace(SamplingParams=SamplingParams,
                                sampling_params=types.SimpleNamespace(StructuredOutputsParams=StructuredOutputsParams))
    old = types.SimpleNamespace(SamplingParams=OldParams,
                                sampling_params=types.SimpleNamespace(GuidedDecodingParams=GuidedDecodingParams))
    assert structured_regex(new, "x") == {"structured_outputs": StructuredOutputsParams(regex="x")}
    assert structured_regex(old, "x") == {"guided_decoding": GuidedDecodingParams(regex="x")}
    neither = types.SimpleNamespace(SamplingParams=OldSamplingParams, sampling_params=types.SimpleNamespace())
    with pytest.raises(ValueError, match="has no structured output"):
        structured_regex(neither, "x")
