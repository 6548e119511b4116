"""Throughput of the ``vlm`` judge: sentences/s of the seeds' protocol (``prompt``: generate + parse) vs ``logits``
(one forward pass per sentence) vs ``logits`` + image-prefix reuse, on the same random-weight model and inputs.

    python benchmarks/judge_throughput.py                                  # CPU: small random Qwen2-VL
    python benchmarks/judge_throughput.py --arch qwen2-vl-2b-config --device cuda --image-size 448 \\
        --captions 64 --batch-size 64                                      # GPU: Qwen2-VL-2B shape, random weights

Speed does not depend on the weights, so the 2B run uses the real architecture (Qwen2-VL-2B config) with random
weights and the tiny locally trained tokenizer. ``prompt`` generates ``--prompt-tokens`` tokens per sentence
(``min_new_tokens`` is set so a random model does not stop early; the seeds' prompt asks for the score first,
then the reason). On CUDA the script also reports the achieved fraction of the bf16 dense peak
(``--peak-tflops``, 989 for an H100 SXM) from a matmul FLOP estimate (2 x params x tokens; attention ignored).
Prints numbers; never passes or fails on time.
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

    from halsift.filtering.tiny_vlm import QWEN_TEMPLATE, _tokenizer, build_tiny_vlm

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

    from halsift.filtering.base import Item

    rng = np.random.default_rng(seed)
    r = random.Random(seed)
    items = []
    for c in range(captions):
        img = Image.fromarray(rng.integers(0, 255, (image_size, image_size, 3), dtype=np.uint8))
        sents = [" ".join(r.choice(WORDS) for _ in range(r.randint(10, 18))).capitalize() + "."
                 for _ in range(sentences)]
        items += [Item(f"c{c}", i, s, sents[:i], img, f"c{c}") for i, s in enumerate(sents)]
    return items


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
    ap.add_argument("--captions", type=int, default=8)
    ap.add_argument("--sentences", type=int, default=7)
    ap.add_argument("--image-size", type=int, default=112)
    ap.add_argument("--batch-size", type=int, default=14, help="sentences per score_batch call")
    ap.add_argument("--prompt-tokens", type=int, default=32, help="tokens generated per sentence in prompt mode")
    ap.add_argument("--prompt-captions", type=int, default=None, help="captions for the (slow) prompt mode")
    ap.add_argument("--repeats", type=int, default=3, help="report the best of this many timed rounds")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    args = ap.parse_args(argv)
    import torch

    from halsift.filtering.vlm_detector import VlmDetector

    dtype = args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model, processor = build(args.arch, args.size, args.image_size, args.device, dtype)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    items = make_items(args.captions, args.sentences, args.image_size)
    n_prompt = args.prompt_captions or max(1, args.captions // 4)
    prompt_items = items[:n_prompt * args.sentences]
    model.generation_config.min_new_tokens = args.prompt_tokens
    res: dict = {"arch": args.arch, "device": args.device, "dtype": dtype, "image_size": args.image_size,
                 "sentences_per_caption": args.sentences, "batch_size": args.batch_size}
    runs = {"prompt": (dict(mode="prompt", max_new_tokens=args.prompt_tokens), prompt_items),
            "logits": (dict(mode="logits", reuse_prefix=False), items),
            "logits_reuse": (dict(mode="logits", reuse_prefix=True), items)}
    for name, (opts, its) in runs.items():
        det = VlmDetector.from_model(model, processor, batch_size=args.batch_size, **opts)
        res[f"{name}/sentences_per_s"] = round(timed(det, its, args.batch_size, sync, args.repeats), 2)
        print(f"{name:14s} {res[f'{name}/sentences_per_s']:10.2f} sentences/s", flush=True)
    base = res["prompt/sentences_per_s"]
    res["ratio/logits_vs_prompt"] = round(res["logits/sentences_per_s"] / base, 2)
    res["ratio/logits_reuse_vs_prompt"] = round(res["logits_reuse/sentences_per_s"] / base, 2)
    res["ratio/logits_reuse_vs_logits"] = round(res["logits_reuse/sentences_per_s"] / res["logits/sentences_per_s"], 2)
    if args.device.startswith("cuda"):
        det = VlmDetector.from_model(model, processor, mode="logits")
        pre = det.prefix_inputs(items[0].image)
        n_img = int((pre["input_ids"] == model.config.image_token_id).sum())
        patches = n_img * 4
        n_vis = sum(p.numel() for p in model.model.visual.parameters())
        n_txt = sum(p.numel() for n, p in model.model.language_model.named_parameters() if "embed" not in n)
        cont = sum(len(det.continuation_ids(it)) for it in items) / len(items)
        per_caption = n_txt * pre["input_ids"].shape[1] + n_vis * patches  # the shared prefix, once per image
        per_sentence = 2 * (per_caption / args.sentences + n_txt * cont)
        res["reuse/flops_per_sentence_G"] = round(per_sentence / 1e9, 1)
        achieved = per_sentence * res["logits_reuse/sentences_per_s"]
        res["reuse/peak_fraction"] = round(achieved / (args.peak_tflops * 1e12), 4)
        res["gpu_peak_mem_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
