"""Throughput of the ``vlm`` judge: sentences/s of the seeds' protocol (``prompt``: generate + parse; the bare
score prompt and, separately, the chain-of-thought prompt) vs ``logits`` (one forward pass per sentence) vs
``logits`` + image-prefix reuse (``logits_reuse``: the prefix's KV cache copied per sentence, image processor on
the host) vs the default path (``logits_packed``: all sentences of an image in one sequence after its prefix under
a block mask, the image processor batched on the model's device), on the same random-weight model and inputs, for
several sentences per caption.

    python benchmarks/judge_throughput.py --size tiny --sentences 1 3 7 12          # CPU: tiny random Qwen2-VL
    python benchmarks/judge_throughput.py --arch qwen2-vl-2b-config --device cuda --image-size 448 \
        --captions 64 --batch-size 64                                                # GPU: Qwen2-VL-2B shape

Speed does not depend on the weights, so the 2B run uses the real architecture (Qwen2-VL-2B config) with random
weights and the tiny locally trained tokenizer. A random model never stops by itself, so ``prompt`` generates
exactly ``--prompt-tokens`` tokens per sentence (default 6: what a reply like ``{"score": 85}`` or ``85`` and
its end-of-turn token take; the seeds' score prompt asks for the number first) and the CoT variant exactly
``--cot-tokens`` (default 96: a one-sentence reason and the score). Those are the honest prices of the seeds'
protocol; padding the reply to more tokens would inflate the ratios. On CUDA the script also reports the
achieved fraction of the bf16 dense peak (``--peak-tflops``, 989 for an H100 SXM) from a matmul FLOP estimate
(2 x params x tokens; attention ignored). Prints numbers; never passes or fails on time. Measure on a quiet
machine (``OMP_NUM_THREADS`` / ``--threads``).

``--vllm`` also measures the ``vllm:`` detector on the same architecture (the model saved to a temporary folder, the
transformers model freed first): ``--vllm-modes`` (yes_prob, logits) at each ``--sentences`` count, requests grouped
by image vs shuffled, and the prefix-cache hit rate (``vllm_judge_bench.py``). Without vLLM or a CUDA device it
prints why and skips that part.

The figures go to ``--json`` after every measured mode (a stopped run keeps what it measured); ``--time-limit``
skips the modes that would start after it (recorded as skipped). ``--modes`` picks the modes.
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time

WORDS = ("a red dog sitting on the green grass next to a small white house under the blue sky while two birds "
         "fly above the tree and a man wearing a black hat stands near the road").split()


def build(arch: str, size: str, image_size: int, device: str, dtype: str):
    import torch
    from transformers import (AutoModelForImageTextToText, AutoProcessor, Qwen2VLConfig,
                              Qwen2VLForConditionalGeneration, Qwen2VLImageProcessor, Qwen2VLProcessor,
                              Qwen2VLVideoProcessor)

    from halsift.synth.tiny_vlm import QWEN_TEMPLATE, _tokenizer, build_tiny_vlm

    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    pixels = dict(size={"shortest_edge": image_size * image_size, "longest_edge": image_size * image_size})
    if arch == "qwen2-vl-2b-config":
        tok = _tokenizer("qwen2-vl", 600)
        ids = tok.convert_tokens_to_ids
        cfg = Qwen2VLConfig(  # Qwen/Qwen2-VL-2B-Instruct dimensions
            text_config=dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                             num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                             tie_word_embeddings=True, bos_token_id=ids("<|endoftext|>"),
                             eos_token_id=ids("<|im_end|>"), pad_token_id=ids("<|endoftext|>"),
                             rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                              "mrope_section": [16, 24, 24]}),
            vision_config=dict(depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4,
                               patch_size=14, spatial_merge_size=2, temporal_patch_size=2, in_channels=3),
            image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
            vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
            attn_implementation="sdpa")
        with torch.device(device):
            torch.set_default_dtype(tdtype)
            model = Qwen2VLForConditionalGeneration(cfg)
            torch.set_default_dtype(torch.float32)
        processor = Qwen2VLProcessor(
            image_processor=Qwen2VLImageProcessor(patch_size=14, merge_size=2, temporal_patch_size=2, **pixels),
            tokenizer=tok, video_processor=Qwen2VLVideoProcessor(), chat_template=QWEN_TEMPLATE)
    else:
        path = build_tiny_vlm(arch, tempfile.mkdtemp(prefix="judge_bench_"), size=size, init_std=0.02)
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=tdtype).to(device)
        processor = AutoProcessor.from_pretrained(path)
        if arch == "qwen2-vl":
            processor.image_processor.size = {"shortest_edge": image_size * image_size,
                                              "longest_edge": image_size * image_size}
    return model.eval(), processor


def make_items(captions: int, sentences: int, image_size: int, seed: int = 0):
    import numpy as np
    from PIL import Image

    from halsift.filtering.detectors.base import Item

    rng = np.random.default_rng(seed)
    r = random.Random(seed)
    items = []
    for c in range(captions):
        img = Image.fromarray(rng.integers(0, 255, (image_size, image_size, 3), dtype=np.uint8))
        sents = [" ".join(r.choice(WORDS) for _ in range(r.randint(10, 18))).capitalize() + "."
                 for _ in range(sentences)]
        items += [Item(f"c{c}", i, s, sents[:i], img, f"c{c}") for i, s in enumerate(sents)]
    return items


MODES = ("prompt", "logits", "logits_reuse", "logits_packed", "prompt_cot", "logits_default")


def timed(det, items, batch_size: int, sync, repeats: int) -> float:
    """Best-of-``repeats`` sentences/s over ``items`` fed as the runner feeds them (whole captions per batch)."""
    det.score_batch(items[:batch_size])  # warm-up
    best = float("inf")
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        for s in range(0, len(items), batch_size):
            det.score_batch(items[s:s + batch_size])
        sync()
        best = min(best, time.perf_counter() - t)
    return len(items) / best


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="qwen2-vl", choices=["qwen2-vl", "llava", "qwen2-vl-2b-config"])
    ap.add_argument("--size", default="small", choices=["tiny", "small"], help="text model size of a built arch")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None, help="float32 on CPU, bfloat16 on CUDA by default")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    ap.add_argument("--captions", type=int, default=8)
    ap.add_argument("--sentences", type=int, nargs="+", default=[7], help="sentences per caption (one row each)")
    ap.add_argument("--image-size", type=int, default=112)
    ap.add_argument("--batch-size", type=int, default=14, help="sentences per score_batch call")
    ap.add_argument("--prompt-tokens", type=int, default=6, help="tokens generated per sentence, score prompt")
    ap.add_argument("--cot-tokens", type=int, default=96, help="tokens generated per sentence, CoT prompt (0: skip)")
    ap.add_argument("--prompt-captions", type=int, default=None, help="captions for the (slow) prompt modes")
    ap.add_argument("--repeats", type=int, default=3, help="report the best of this many timed rounds")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    ap.add_argument("--json", default="", help="also write the figures to this JSON file (after every mode)")
    ap.add_argument("--modes", nargs="+", default=list(MODES[:-1]), choices=MODES,
                    help="judge modes measured (logits_default: the vlm detector's defaults, packed on CUDA and the "
                         "cached path on CPU; not measured unless named)")
    ap.add_argument("--time-limit", type=float, default=0.0,
                    help="seconds from the start, model build included (0: none); modes that would start after it "
                         "are skipped")
    ap.add_argument("--vllm", action="store_true", help="also measure the vllm: detector (needs vLLM and CUDA)")
    ap.add_argument("--vllm-captions", type=int, default=None, help="captions per timed vllm round "
                                                                      "(default: --captions)")
    ap.add_argument("--vllm-modes", nargs="+", default=["yes_prob", "logits"], help="vllm: detector modes measured")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    import torch

    from halsift.filtering.detectors.vlm import VlmDetector

    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    if args.threads:
        torch.set_num_threads(args.threads)
    model, processor = build(args.arch, args.size, args.image_size, args.device, dtype)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    res: dict = {"arch": args.arch, "size": args.size, "device": args.device, "dtype": dtype,
                 "image_size": args.image_size, "batch_size": args.batch_size, "prompt_tokens": args.prompt_tokens,
                 "cot_tokens": args.cot_tokens, "threads": torch.get_num_threads()}
    n_prompt = args.prompt_captions or max(1, args.captions // 4)

    def save() -> None:
        if args.json:
            from pathlib import Path

            Path(args.json).write_text(json.dumps(res, indent=1))

    for n_sent in args.sentences:
        items = make_items(args.captions, n_sent, args.image_size)
        prompt_items = items[:n_prompt * n_sent]
        # today's modes keep the image processor on the host (preprocess=cpu); logits_packed is the default path
        runs = {"prompt": (dict(mode="prompt", max_new_tokens=args.prompt_tokens, preprocess="cpu"), prompt_items,
                           args.prompt_tokens),
                "logits": (dict(mode="logits", reuse_prefix=False, preprocess="cpu"), items, 0),
                "logits_reuse": (dict(mode="logits", reuse_prefix=True, pack=False, preprocess="cpu"), items, 0),
                "logits_packed": (dict(mode="logits", pack=True), items, 0),
                "logits_default": (dict(mode="logits"), items, 0)}
        if args.cot_tokens:
            runs["prompt_cot"] = (dict(mode="prompt", cot=True, max_new_tokens=args.cot_tokens, preprocess="cpu"),
                                  items[:max(1, n_prompt // 2) * n_sent], args.cot_tokens)
        row: dict = {}
        for name, (opts, its, forced) in runs.items():
            if name not in args.modes:
                continue
            if args.time_limit and time.perf_counter() - t0 > args.time_limit:
                res[f"s{n_sent}/{name}/skipped"] = f"past --time-limit {args.time_limit:g} s"
                save()
                continue
            model.generation_config.min_new_tokens = forced or None
            det = VlmDetector.from_model(model, processor, batch_size=args.batch_size, **opts)
            row[name] = timed(det, its, args.batch_size, sync, args.repeats)
            model.generation_config.min_new_tokens = None
            res[f"s{n_sent}/{name}/sentences_per_s"] = round(row[name], 2)
            if name == "logits_packed":
                res[f"s{n_sent}/logits_packed/packs"] = det.packs
            for a, b in (("logits_reuse", "prompt"), ("logits_reuse", "logits"), ("logits", "prompt"),
                         ("logits_reuse", "prompt_cot"), ("logits_packed", "logits_reuse"),
                         ("logits_packed", "logits"), ("logits_default", "logits_reuse")):
                if a in row and b in row:
                    res[f"s{n_sent}/ratio/{a}_vs_{b}"] = round(row[a] / row[b], 2)
            res["elapsed_s"] = round(time.perf_counter() - t0, 1)
            save()
        model.generation_config.min_new_tokens = None
        best_today = max((row[k] for k in ("logits", "logits_reuse", "prompt") if k in row), default=0)
        if "logits_packed" in row and best_today:
            res[f"s{n_sent}/ratio/logits_packed_vs_best_today"] = round(row["logits_packed"] / best_today, 2)
        save()
        print(f"{n_sent:2d} sentences/caption: " + "  ".join(f"{k} {v:.1f}/s" for k, v in row.items())
              + "".join(f"  {k.split('/')[-1]} {v:.2f}x" for k, v in res.items()
                        if k.startswith(f"s{n_sent}/ratio/")), flush=True)
    if args.device.startswith("cuda") and "logits_reuse" in args.modes and \
            f"s{args.sentences[-1]}/logits_reuse/sentences_per_s" in res:
        n_sent = args.sentences[-1]
        det = VlmDetector.from_model(model, processor, mode="logits")
        pre = det.prefix_inputs(items[0].image)
        n_img = int((pre["input_ids"] == model.config.image_token_id).sum())
        patches = n_img * 4
        n_vis = sum(p.numel() for p in model.model.visual.parameters())
        n_txt = sum(p.numel() for n, p in model.model.language_model.named_parameters() if "embed" not in n)
        cont = sum(len(det.continuation_ids(it)) for it in items) / len(items)
        per_caption = n_txt * pre["input_ids"].shape[1] + n_vis * patches  # the shared prefix, once per image
        per_sentence = 2 * (per_caption / n_sent + n_txt * cont)
        res["reuse/flops_per_sentence_G"] = round(per_sentence / 1e9, 1)
        achieved = per_sentence * res[f"s{n_sent}/logits_reuse/sentences_per_s"]
        res["reuse/peak_fraction"] = round(achieved / (args.peak_tflops * 1e12), 4)
        res["gpu_peak_mem_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        if f"s{n_sent}/logits_packed/sentences_per_s" in res:
            res["packed/peak_fraction"] = round(
                per_sentence * res[f"s{n_sent}/logits_packed/sentences_per_s"] / (args.peak_tflops * 1e12), 4)
        save()
    if args.vllm:
        res.update(vllm_figures(args, model, processor))
    res["elapsed_s"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(res, indent=1))
    save()
    return res


def vllm_figures(args, model, processor) -> dict:
    """The vllm detector's figures on this model (saved, then freed from the GPU); skipped with the reason where
    vLLM or CUDA is missing."""
    import gc
    import sys
    from pathlib import Path

    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    import vllm_judge_bench

    why = vllm_judge_bench.unavailable()
    if why:
        print(f"vllm: skipped ({why})", flush=True)
        return {"vllm/skipped": why}
    folder = tempfile.mkdtemp(prefix="judge_bench_vllm_")
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    model.to("meta")
    gc.collect()
    torch.cuda.empty_cache()
    captions = args.vllm_captions or args.captions
    return vllm_judge_bench.measure(folder, lambda n, seed: make_items(captions, n, args.image_size, seed),
                                    args.sentences, max(args.batch_size, captions), repeats=args.repeats,
                                    modes=args.vllm_modes, max_pixels=args.image_size * args.image_size)


if __name__ == "__main__":
    main()
