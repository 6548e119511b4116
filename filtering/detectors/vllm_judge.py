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
* ``prompt``: the seeds' score prompt (``context=true``: the preceding sentences first, AlignBench Table D), greedy,
  the reply constrained by structured output to ``{"score": N}`` with N in 0..100 (``StructuredOutputsParams``, or
  ``GuidedDecodingParams`` on older vLLM), read with :func:`~halsift.filtering.detectors.vlm_prompts.parse_score`;
  a reply without a score scores 50 with ``parsed=false`` (counted by the runner, as for ``vlm:mode=prompt``).

**Requests**: one per sentence, the chat-templated ``[image, instruction + caption]`` user turn (the model's own
processor template, as the ``vlm`` detector builds it), so every request of one image starts with the same image and
instruction and ends with its sentence. A batch's requests are submitted in one ``generate`` call, grouped by image
(first-appearance order), so vLLM's prefix cache and encoder cache serve a caption's sentences. The image's content
hash (:func:`image_uuid`, after the ``max_pixels`` cap) is its ``multi_modal_uuids`` entry. ``max_pixels`` caps the
image on the host (the ``vlm`` detector's cap) and is passed to the engine's processor (``mm_processor_kwargs``);
``limit_mm_per_prompt`` is one image.

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

MODES = ("yes_prob", "prompt")
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
    vocab = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    yes = [i for i, s in enumerate(vocab) if s.strip().lower() == "yes"]
    no = [i for i, s in enumerate(vocab) if s.strip().lower() == "no"]
    if not yes or not no:
        raise ValueError("mode=yes_prob needs tokens spelling 'yes' and 'no' in the vocabulary")
    return yes, no


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

    # one line of help per spec option (docs/config.md, --describe); a test keeps it in step with __init__
    OPTION_HELP = {
        "model": "a vLLM-supported image-text model: hub name or local folder",
        "mode": "yes_prob (yes/no log-probabilities of the first generated token) | prompt (the seeds' 0-100 "
                "answer, constrained by structured output)",
        "context": "mode=prompt: put the caption's preceding sentences before the target (AlignBench Table D)",
        "dtype": "vLLM dtype: auto | bfloat16 | float16 | float32",
        "max_pixels": "images with more pixels are downscaled (aspect kept) on the host and by the engine's "
                      "processor (mm_processor_kwargs); 0 = no cap",
        "top_logprobs": "mode=yes_prob, where vLLM lacks logprob_token_ids: how many top alternatives are read",
        "max_new_tokens": "mode=prompt: generation cap of the constrained reply",
        "gpu_memory_utilization": "fraction of the GPU's memory vLLM may take",
        "max_model_len": "vLLM's context length (default: the model's)",
        "tensor_parallel_size": "GPUs one engine spans",
        "seed": "the engine's seed",
        "trust_remote_code": "run the model repository's own code (off; only from your own spec, never from a "
                             "file a detector loads)",
    }

    def __init__(self, model: str, mode: str = "yes_prob", context: bool = False, dtype: str = "auto",
                 max_pixels: int = DEFAULT_MAX_PIXELS, top_logprobs: int = 20, max_new_tokens: int = 12,
                 gpu_memory_utilization: float = 0.9, max_model_len: int | None = None,
                 tensor_parallel_size: int = 1, seed: int = 0, trust_remote_code: bool = False) -> None:
        super().__init__()
        if mode not in MODES:
            hint = " (the yes/no log-probability reading is mode=yes_prob)" if mode == "logits" else ""
            raise ValueError(f"mode={mode!r}: expected one of {MODES}{hint}")
        if not isinstance(max_pixels, int) or max_pixels < 0:
            raise ValueError(f"max_pixels={max_pixels!r}: expected an integer >= 0 (0: no cap)")
        if int(top_logprobs) < 2 or int(max_new_tokens) < 1:
            raise ValueError(f"top_logprobs={top_logprobs!r}, max_new_tokens={max_new_tokens!r}: expected "
                             "top_logprobs >= 2 and max_new_tokens >= 1")
        if context and mode != "prompt":
            raise ValueError(f"context=true needs mode=prompt (got mode={mode!r}): the yes/no question has no caption")
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
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        if self.mode == "yes_prob":
            self.yes_ids, self.no_ids = yes_no_ids(tokenizer)
            kw: dict[str, Any] = {"max_tokens": 1, "temperature": 0.0}
            names = param_names(self.vllm.SamplingParams)
            if "detokenize" in names:  # the reply's text is not read
                kw["detokenize"] = False
            if "logprob_token_ids" in names:
                kw["logprob_token_ids"] = [*self.yes_ids, *self.no_ids]
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
        return chat_text(self.processor, P.SCORE_PROMPT + P.CAPTION_LEAD + " " + caption)

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
                requests.append({"prompt": self.prompt_text(items[i]), "multi_modal_data": {"image": image},
                                 "multi_modal_uuids": {"image": uuid}})
                order.append(i)
                keys.append(f"{items[i].key}#{items[i].sentence_index}")
        return {"requests": requests, "order": order, "keys": keys}

    # ------------------------------------------------------------------------------------------ the engine
    def score_prepared(self, items: Sequence[Any], prepared: dict) -> list[Result]:
        """Submit :meth:`prepare`'s requests in one ``generate`` call and read each reply (``items`` are only
        counted: they may be the runner's row tuples)."""
        replies = self._generate(prepared["requests"], prepared["keys"])
        out: list[Result | None] = [None] * len(prepared["order"])
        for i, reply in zip(prepared["order"], replies):
            out[i] = Result(50.0, parsed=False) if reply is None else self._read(reply)
        return out  # type: ignore[return-value]

    def _read(self, reply: Any) -> Result:
        completion = reply.outputs[0]
        if self.mode == "yes_prob":
            if not completion.logprobs:
                return Result(50.0, parsed=False)
            return yes_no_score(completion.logprobs[0], self.yes_ids, self.no_ids)
        value = P.parse_score(completion.text)
        return Result(50.0, parsed=False) if value is None else Result(value)

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


__all__ = ["INSTALL_HINT", "MODES", "SCORE_REGEX", "VllmDetector", "engine_kwargs", "from_engine", "image_uuid",
           "import_vllm", "param_names", "split_point", "structured_regex", "yes_no_ids", "yes_no_score"]
