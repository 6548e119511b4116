"""``vllm`` detector: a VLM judge served by an offline ``vllm.LLM`` engine that the detector owns (one per scoring
process or task), for judging millions of sentences with continuous batching and prefix caching.

Spec: ``vllm:model=PATH[,mode=yes_prob|prompt,...]`` (extra ``halsift[vllm]``; vLLM is imported when the detector is
built, and a missing vLLM is a one-line error). The score definitions are the ``vlm`` detector's
(:mod:`halsift.filtering.detectors.vlm`) on the same prompts (:mod:`halsift.filtering.detectors.vlm_prompts`):

* ``yes_prob`` (default; the issue's "logits" reading): ``Does this figure show "<sentence>"? Please answer yes or
  no.``; one generated token (``max_tokens=1``, greedy) whose log-probabilities are read at the first generated
  position; score = ``100 * P(yes) / (P(yes) + P(no))``, summing every token that decodes to yes / no (any case,
  any surrounding space), exactly as ``vlm:mode=yes_prob``. The yes/no ids are requested with ``logprob_token_ids``
  where the installed vLLM's ``SamplingParams`` has it (exact), else read from the top ``top_logprobs`` alternatives
  (a variant outside them counts 0; a reply with neither in them scores 50 with ``parsed=false``). Never
  ``prompt_logprobs``: they bypass the prefix cache.
* ``logits``: ``vlm:mode=logits``'s expected number: the seeds' score prompt with the assistant turn prefilled
  with ``{"score": `` and the number read from the next-token distribution. A vocabulary with one token per number
  0..100 takes one request (the tokens of each number summed, renormalised over 0..100, averaged); a digit
  vocabulary (Qwen2, Llama-2, Gemma) three requests per sentence, the prefill, the prefill + ``1`` and the prefill
  + ``10`` (token prompts, so the forced digits are the transformers judge's tokens; all three share the cached
  prefix), combined by ``vlm``'s formula (first digit; 1, 10-19 and 100 resolved; other decades at their middle).
  Read like ``yes_prob``: ``logprob_token_ids`` where vLLM has it (exact), else the top ``top_logprobs``.
* ``prompt``: the seeds' score prompt (``context=true``: the preceding sentences first, AlignBench Table D), greedy,
  the reply constrained by structured output to ``{"score": N}`` with N in 0..100 (``StructuredOutputsParams``, or
  ``GuidedDecodingParams`` on older vLLM), read with :func:`~halsift.filtering.detectors.vlm_prompts.parse_score`;
  a reply without a score scores 50 with ``parsed=false`` (counted by the runner, as for ``vlm:mode=prompt``).

**Requests**: one per sentence (three on the digit path of ``logits``), the chat-templated ``[image, instruction +
caption]`` user turn (the model's own processor template, as the ``vlm`` detector builds it), so every request of
one image starts with the same image and instruction and ends with its sentence. A batch's requests are submitted in
one ``generate`` call, grouped by image (first-appearance order), so vLLM's prefix cache and encoder cache serve a
caption's sentences. The image's content hash (:func:`image_uuid`, after the ``max_pixels`` cap) is its
``multi_modal_uuids`` entry. ``max_pixels`` caps the image on the host (the ``vlm`` detector's cap) and is passed to
the engine's processor (``mm_processor_kwargs``); ``limit_mm_per_prompt`` is one image.

**CPU half** (:meth:`VllmDetector.prepare`): the cap, the hash and the prompt text run in ``score --decode-workers``
processes (or the read-ahead thread); the scoring thread only submits requests.

**Failures**: a ``generate`` call that raises (an engine crash, out of memory) rebuilds the engine (unless the error
is a ValueError/TypeError: a refused input leaves the engine alive) and retries the batch in halves, split between
images, until the failing request is alone; a request that fails alone scores 50 with ``parsed=false`` and a warning
names its item (``failed_requests`` counts them). Parts stay resumable as for every detector: the runner writes a
part whole or not at all.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import math
import warnings
from collections.abc import Sequence
from typing import Any

from halsift.filtering.detectors import vlm_prompts as P
from halsift.filtering.detectors.base import Detector, DetectorError, Item, PreparedDetector, Result, image_group
from halsift.filtering.detectors.vlm_judge import DEFAULT_MAX_PIXELS, cap_pixels, chat_text

MODES = ("yes_prob", "logits", "prompt")
SCORE_REGEX = r'\{"score": (100|[1-9]?[0-9])\}'  # prompt mode: the seeds' dictionary form, an integer 0..100
INSTALL_HINT = "pip install 'halsift[vllm]' on a machine with a CUDA GPU"


def import_vllm() -> Any:
    """The installed ``vllm`` module; a one-line ValueError when it is missing."""
    try:
        import vllm
    except ImportError as e:
        raise ValueError(f"the vllm detector needs vLLM, which is not installed ({e}); {INSTALL_HINT}") from None
    return vllm


def image_uuid(image: Any) -> str:
    """A content hash of a PIL image (mode, size and pixels): its ``multi_modal_uuids`` entry, so requests of one
    image share vLLM's processor and encoder caches whatever Python object holds it."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{image.mode}:{image.width}x{image.height}:".encode())
    h.update(image.tobytes())
    return "img-" + h.hexdigest()


def param_names(cls: type) -> set[str]:
    """The fields a vLLM parameter class takes (msgspec Struct, dataclass or plain ``__init__``)."""
    if hasattr(cls, "__struct_fields__"):
        return set(cls.__struct_fields__)
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(inspect.signature(cls).parameters)


def structured_regex(vllm: Any, regex: str) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments constraining the reply to ``regex``: ``structured_outputs`` (vLLM >= 0.11)
    or ``guided_decoding`` (older); a ValueError when the installed vLLM has neither."""
    sp = getattr(vllm, "sampling_params", None)
    names = param_names(vllm.SamplingParams)
    if sp is not None and hasattr(sp, "StructuredOutputsParams") and "structured_outputs" in names:
        return {"structured_outputs": sp.StructuredOutputsParams(regex=regex)}
    if sp is not None and hasattr(sp, "GuidedDecodingParams") and "guided_decoding" in names:
        return {"guided_decoding": sp.GuidedDecodingParams(regex=regex)}
    raise ValueError("mode=prompt: the installed vLLM has no structured output (StructuredOutputsParams or "
                     "GuidedDecodingParams)")


def yes_no_ids(tokenizer: Any) -> tuple[list[int], list[int]]:
    """Token ids whose decoded text, stripped of whitespace, is "yes" / "no" in any case (``vlm:mode=yes_prob``'s)."""
    vocab = _vocab(tokenizer)
    yes = [i for i, s in enumerate(vocab) if s.strip().lower() == "yes"]
    no = [i for i, s in enumerate(vocab) if s.strip().lower() == "no"]
    if not yes or not no:
        raise ValueError("mode=yes_prob needs tokens spelling 'yes' and 'no' in the vocabulary")
    return yes, no


def _vocab(tokenizer: Any) -> list[str]:
    return tokenizer.batch_decode([[i] for i in range(len(tokenizer))])


def number_ids(tokenizer: Any) -> tuple[str, dict[int, list[int]], list[int]]:
    """``vlm:mode=logits``'s number tables: ``("single", ids, [])`` when every number 0..100 is a token,
    ``("digits", ids, [id of "1", id of "0"])`` when the digits are; ``ids``: number -> token ids spelling it
    (decoded text stripped of whitespace, canonical: ``"85"``, ``" 85"``, not ``"085"``)."""
    ids: dict[int, list[int]] = {n: [] for n in range(101)}
    for i, text in enumerate(_vocab(tokenizer)):
        text = text.strip()
        if text.isascii() and text.isdigit() and text == str(int(text)) and int(text) <= 100:
            ids[int(text)].append(i)
    if all(ids[n] for n in range(101)):
        return "single", ids, []
    if not all(ids[d] for d in range(10)):
        raise ValueError("mode=logits: the vocabulary has neither single tokens for 0..100 nor for the digits")
    if any(ids[n] for n in range(10, 101)):
        warnings.warn("mode=logits: the vocabulary has some multi-digit number tokens but not all of 0..100; "
                      "scoring by digits, so the mass on multi-digit tokens is ignored", stacklevel=3)
    force = [tokenizer(d, add_special_tokens=False)["input_ids"] for d in ("1", "0")]
    if any(len(f) != 1 for f in force):
        raise ValueError("mode=logits: the tokenizer does not encode '1' and '0' as single tokens")
    return "digits", ids, [force[0][0], force[1][0]]


def expected_number(positions: Sequence[dict], number_mode: str, ids: dict[int, list[int]]) -> Result:
    """``vlm:mode=logits``'s score from the first generated position of each request of one sentence (one
    request, or the three of the digit path); 50, unparsed, when no number token appears."""
    def mass(pos: dict, n: int) -> float:
        return sum(math.exp(pos[i].logprob) for i in ids[n] if i in pos)

    if number_mode == "single":
        m = [mass(positions[0], n) for n in range(101)]
        total = sum(m)
        return Result(sum(n * x for n, x in enumerate(m)) / total) if total > 0 else Result(50.0, parsed=False)
    p1 = [mass(positions[0], d) for d in range(10)]
    total = sum(p1)
    if total <= 0:
        return Result(50.0, parsed=False)
    q = [mass(positions[1], d) for d in range(10)]
    q_end, r0 = max(0.0, 1.0 - sum(q)), mass(positions[2], 0)
    v1 = q_end + sum(q[e] * (10 + e) for e in range(1, 10)) + q[0] * (r0 * 100 + (1 - r0) * 10)
    values = [0.0, v1] + [10 * d + 4.5 for d in range(2, 10)]
    return Result(sum(p / total * v for p, v in zip(p1, values)))


def yes_no_score(position: dict, yes: Sequence[int], no: Sequence[int]) -> Result:
    """``100 P(yes) / (P(yes) + P(no))`` from one position's ``{token_id: Logprob}``; 50, unparsed, when neither
    appears."""
    py = sum(math.exp(position[i].logprob) for i in yes if i in position)
    pn = sum(math.exp(position[i].logprob) for i in no if i in position)
    if py + pn <= 0:
        return Result(50.0, parsed=False)
    return Result(100.0 * py / (py + pn))


class VllmDetector(PreparedDetector):
    """Judge (image, sentence) pairs with an offline vLLM engine; see the module docstring."""

    family = "vllm"
    CALLS_JUDGE = True  # a judge asked about every unit it scores (filtering/scoring/judge_spend.py)

    # one line of help per spec option (docs/config.md, --describe); a test keeps it in step with __init__
    OPTION_HELP = {
        "model": "a vLLM-supported image-text model: hub name or local folder",
        "mode": "yes_prob (yes/no log-probabilities of the first generated token) | logits (vlm's expected "
                "0-100 number) | prompt (the seeds' 0-100 answer, constrained by structured output)",
        "context": "mode=logits/prompt: put the caption's preceding sentences before the target (AlignBench Table D)",
        "dtype": "vLLM dtype: auto | bfloat16 | float16 | float32",
        "max_pixels": "images with more pixels are downscaled (aspect kept) on the host and by the engine's "
                      "processor (mm_processor_kwargs); 0 = no cap",
        "top_logprobs": "mode=yes_prob/logits, where vLLM lacks logprob_token_ids: how many top alternatives are read",
        "max_new_tokens": "mode=prompt: generation cap of the constrained reply",
        "gpu_memory_utilization": "fraction of the GPU's memory vLLM may take",
        "max_model_len": "vLLM's context length (default: the model's)",
        "tensor_parallel_size": "GPUs one engine spans",
        "seed": "the engine's seed",
        "trust_remote_code": "run the model repository's own code (off; only from your own spec, never from a "
                             "file a detector loads)",
    }

    # the options' ranges, declared once: the dry run (check_spec) and the build check them (spec._check_types)
    OPTION_RANGES = {"seed": "[0, inf)", "max_pixels": "[0, inf)", "top_logprobs": "[2, inf)",
                     "max_new_tokens": "[1, inf)", "gpu_memory_utilization": "(0, 1]", "max_model_len": "[1, inf)",
                     "tensor_parallel_size": "[1, inf)"}

    def __init__(self, model: str, mode: str = "yes_prob", context: bool = False, dtype: str = "auto",
                 max_pixels: int = DEFAULT_MAX_PIXELS, top_logprobs: int = 20, max_new_tokens: int = 12,
                 gpu_memory_utilization: float = 0.9, max_model_len: int | None = None,
                 tensor_parallel_size: int = 1, seed: int = 0, trust_remote_code: bool = False) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode={mode!r}: expected one of {MODES}")
        if not isinstance(max_pixels, int) or max_pixels < 0:
            raise ValueError(f"max_pixels={max_pixels!r}: expected an integer >= 0 (0: no cap)")
        if int(top_logprobs) < 2 or int(max_new_tokens) < 1:
            raise ValueError(f"top_logprobs={top_logprobs!r}, max_new_tokens={max_new_tokens!r}: expected "
                             "top_logprobs >= 2 and max_new_tokens >= 1")
        if context and mode == "yes_prob":
            raise ValueError("context=true needs mode=logits or prompt: the yes/no question has no caption")
        self.vllm = import_vllm()
        from transformers import AutoProcessor

        try:
            self.processor = AutoProcessor.from_pretrained(model, trust_remote_code=bool(trust_remote_code))
        except (OSError, ValueError) as e:
            raise ValueError(f"model={model!r}: cannot load its processor ({e})") from None
        self.mode, self.context, self.max_pixels = mode, bool(context), int(max_pixels)
        self.engine_kwargs = engine_kwargs(model, dtype=dtype, max_pixels=max_pixels, top_logprobs=int(top_logprobs),
                                           gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
                                           tensor_parallel_size=tensor_parallel_size, seed=seed,
                                           trust_remote_code=trust_remote_code)
        self.llm = self.vllm.LLM(**self.engine_kwargs)
        self._setup(int(top_logprobs), int(max_new_tokens))

    def _setup(self, top_logprobs: int, max_new_tokens: int) -> None:
        self.failed_requests = self.rebuilds = 0
        self.tokenizer = tokenizer = getattr(self.processor, "tokenizer", self.processor)
        self.number_mode, self.force = "", []
        if self.mode in ("yes_prob", "logits"):
            if self.mode == "yes_prob":
                self.yes_ids, self.no_ids = yes_no_ids(tokenizer)
                read = [*self.yes_ids, *self.no_ids]
            else:
                self.number_mode, self.number_ids, self.force = number_ids(tokenizer)
                read = sorted({i for n in (range(101) if self.number_mode == "single" else range(10))
                               for i in self.number_ids[n]})
            kw: dict[str, Any] = {"max_tokens": 1, "temperature": 0.0}
            names = param_names(self.vllm.SamplingParams)
            if "detokenize" in names:  # the reply's text is not read
                kw["detokenize"] = False
            if "logprob_token_ids" in names:
                kw["logprob_token_ids"] = read
            else:
                kw["logprobs"] = top_logprobs
        else:
            kw = {"max_tokens": max_new_tokens, "temperature": 0.0, **structured_regex(self.vllm, SCORE_REGEX)}
        self.sampling = self.vllm.SamplingParams(**kw)

    # ------------------------------------------------------------------------------------------ CPU half
    def prompt_text(self, it: Item) -> str:
        """The chat-templated user turn of ``it`` (image placeholder first, the sentence last)."""
        if self.mode == "yes_prob":
            return chat_text(self.processor, P.YES_NO_PROMPT.replace("{sentence}", it.sentence.strip()))
        caption = P.caption_text(it.sentence, it.context if self.context else None)
        return chat_text(self.processor, P.SCORE_PROMPT + P.CAPTION_LEAD + " " + caption,
                         P.SCORE_PREFILL if self.mode == "logits" else "")

    def prompts(self, it: Item) -> list[dict]:
        """The prompt(s) of ``it`` without the image: its text, or for the digit path of ``mode=logits`` the
        token ids of the text, then + ``1``, then + ``10``."""
        text = self.prompt_text(it)
        if self.number_mode != "digits":
            return [{"prompt": text}]
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return [{"prompt_token_ids": ids + self.force[:k]} for k in range(3)]

    def prepare(self, items: Sequence[Item]) -> dict:
        """The requests of ``items``, grouped by image (first appearance), and each request's item position. Each
        distinct image is capped and hashed once. Never touches the engine."""
        if any(it.image is None for it in items):
            raise DetectorError("vllm detector: an item has no image")
        groups: dict[tuple, list[int]] = {}
        for i, it in enumerate(items):
            groups.setdefault(image_group(it), []).append(i)
        requests, order, keys = [], [], []
        for positions in groups.values():
            image = items[positions[0]].image
            image = cap_pixels(image if image.mode == "RGB" else image.convert("RGB"), self.max_pixels)
            uuid = image_uuid(image)
            for i in positions:
                for prompt in self.prompts(items[i]):
                    requests.append({**prompt, "multi_modal_data": {"image": image},
                                     "multi_modal_uuids": {"image": uuid}})
                    order.append(i)
                    keys.append(f"{items[i].key}#{items[i].sentence_index}")
        return {"requests": requests, "order": order, "keys": keys}

    # ------------------------------------------------------------------------------------------ the engine
    def score_prepared(self, items: Sequence[Any], prepared: dict) -> list[Result]:
        """Submit :meth:`prepare`'s requests in one ``generate`` call and read each reply (``items`` are only
        counted: they may be the runner's row tuples)."""
        replies = self._generate(prepared["requests"], prepared["keys"])
        per_item: dict[int, list] = {}
        for i, reply in zip(prepared["order"], replies):
            per_item.setdefault(i, []).append(reply)
        return [self._read(per_item[i]) for i in range(len(per_item))]

    def _read(self, replies: list) -> Result:
        """One sentence's score from its replies (``None``: a request that failed alone)."""
        if any(r is None for r in replies):
            return Result(50.0, parsed=False)
        completions = [r.outputs[0] for r in replies]
        if self.mode == "prompt":
            value = P.parse_score(completions[0].text)
            return Result(50.0, parsed=False) if value is None else Result(value)
        if not all(c.logprobs for c in completions):
            return Result(50.0, parsed=False)
        positions = [c.logprobs[0] for c in completions]
        if self.mode == "yes_prob":
            return yes_no_score(positions[0], self.yes_ids, self.no_ids)
        return expected_number(positions, self.number_mode, self.number_ids)

    def _generate(self, requests: list[dict], keys: list[str]) -> list[Any]:
        """Replies in request order; a failing call is retried in halves split between images (see the module
        docstring); a request that fails alone gives ``None``."""
        if not requests:
            return []
        try:
            return list(self.llm.generate(requests, self.sampling, use_tqdm=False))
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as e:  # an engine crash or out-of-memory, or a request the engine refuses
            if not isinstance(e, (ValueError, TypeError)):
                if not self.engine_kwargs:  # an engine handed in (from_engine): this detector cannot rebuild it
                    raise
                self.llm = self.vllm.LLM(**self.engine_kwargs)
                self.rebuilds += 1
            if len(requests) == 1:
                self.failed_requests += 1
                warnings.warn(f"vllm detector: the request for {keys[0]} failed alone ({type(e).__name__}: "
                              f"{str(e)[:200]}); scored 50, parsed=false", stacklevel=2)
                return [None]
            mid = split_point([r["multi_modal_uuids"]["image"] for r in requests])
            return self._generate(requests[:mid], keys[:mid]) + self._generate(requests[mid:], keys[mid:])


def split_point(uuids: Sequence[str]) -> int:
    """Where to halve a list of requests: the image boundary nearest its middle (the middle when one image holds
    them all)."""
    bounds = [i for i in range(1, len(uuids)) if uuids[i] != uuids[i - 1]]
    mid = len(uuids) // 2
    return min(bounds, key=lambda b: (abs(b - mid), b)) if bounds else mid


def engine_kwargs(model: str, *, dtype: str, max_pixels: int, top_logprobs: int, gpu_memory_utilization: float,
                  max_model_len: int | None, tensor_parallel_size: int, seed: int,
                  trust_remote_code: bool) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments: prefix caching on, one image per prompt, the processor's ``max_pixels``, enough
    logprobs for ``top_logprobs``, ``trust_remote_code`` only as given."""
    kw: dict[str, Any] = {"model": model, "dtype": dtype, "seed": int(seed), "enable_prefix_caching": True,
                          "limit_mm_per_prompt": {"image": 1}, "gpu_memory_utilization": float(gpu_memory_utilization),
                          "tensor_parallel_size": int(tensor_parallel_size), "max_logprobs": max(20, top_logprobs),
                          "trust_remote_code": bool(trust_remote_code)}
    if max_pixels:
        kw["mm_processor_kwargs"] = {"max_pixels": int(max_pixels)}
    if max_model_len:
        kw["max_model_len"] = int(max_model_len)
    return kw


def from_engine(llm: Any, processor: Any, vllm: Any, *, mode: str = "yes_prob", context: bool = False,
                max_pixels: int = DEFAULT_MAX_PIXELS, top_logprobs: int = 20, max_new_tokens: int = 12,
                name: str = "vllm:in-memory") -> VllmDetector:
    """Wrap an existing engine and processor (benchmarks sharing one engine across runs)."""
    self = VllmDetector.__new__(VllmDetector)
    Detector.__init__(self, name)
    self.vllm, self.llm, self.processor = vllm, llm, processor
    self.mode, self.context, self.max_pixels, self.engine_kwargs = mode, bool(context), int(max_pixels), {}
    self._setup(top_logprobs, max_new_tokens)
    return self


__all__ = ["INSTALL_HINT", "MODES", "SCORE_REGEX", "VllmDetector", "engine_kwargs", "expected_number", "from_engine",
           "image_uuid", "import_vllm", "number_ids", "param_names", "split_point", "structured_regex", "yes_no_ids",
           "yes_no_score"]
