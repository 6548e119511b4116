"""The product path end to end: a VLM judge saved to disk, ``halsift score`` run from the command line on JPEG shards
on disk, then ``halsift select``: the sentences/s a user gets, model loading, workers and parquet writing included.

    python benchmarks/product_path.py --size 2b --device cuda --json product.json   # Qwen2-VL-2B shape, bf16
    python benchmarks/product_path.py --size tiny --json product.json                # CPU: tiny random Qwen2-VL

The judge has random weights (speed does not depend on them): ``--size 2b`` is the Qwen2-VL-2B architecture that
``judge_throughput.py``'s ``build`` makes, ``tiny`` its tiny test model. It is saved with ``save_pretrained`` and
scored as ``vlm:model=DIR,mode=logits`` (the default mode, image-prefix reuse on). Beside the figures: the FLOPs per
sentence (2 x parameters x tokens: the image prefix once per caption, each sentence's own tokens; attention
ignored), the bf16 dense peak of the card (``--peak-tflops``, else a table of known cards) and the share of it
reached by the scoring loop. ``--json PATH`` is rewritten after every step, so a run stopped by a time limit keeps
what it measured. Prints numbers; never passes or fails on time.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
# bf16 dense tensor-core peaks (TFLOP/s, no sparsity) of the SXM parts; a PCIe/NVL card is slower: pass --peak-tflops
PEAK_BF16 = {"H200": 989.0, "H100": 989.0, "GH200": 989.0, "B200": 2250.0, "A100": 312.0, "L40S": 362.0,
             "A10G": 70.0, "L4": 121.0}
WORDS = ("a red dog sitting on the green grass next to a small white house under the blue sky while two birds "
         "fly above the tree and a man wearing a black hat stands near the road").split()


def peak_tflops(device_name: str, given: float | None) -> tuple[float | None, str]:
    """(bf16 peak, where it came from): ``given``, else the first :data:`PEAK_BF16` name in ``device_name``."""
    if given:
        return given, "--peak-tflops"
    for name, tf in PEAK_BF16.items():
        if name.lower() in device_name.lower():
            return tf, f"table: {name} SXM bf16 dense"
    return None, f"unknown card {device_name!r}: pass --peak-tflops"


def write_shards(folder: Path, captions: int, sentences: int, image_size: int, per_shard: int, seed: int = 0) -> int:
    """Photo-like JPEGs (smooth gradients plus mild noise), one caption of ``sentences`` sentences each."""
    import numpy as np
    from PIL import Image

    from halsift.corpus.shards import Sample, ShardWriter

    rng = np.random.default_rng(seed)
    r = random.Random(seed)
    x = np.linspace(0, 1, image_size)
    grad = np.stack([np.add.outer(x, x) * 110, np.outer(1 - x, x) * 255, np.outer(x, 1 - x) * 255], -1)
    base = np.clip(grad + rng.normal(0, 6, grad.shape), 0, 255).astype(np.uint8)
    with ShardWriter(folder, maxcount=per_shard) as w:
        for i in range(captions):
            buf = io.BytesIO()
            Image.fromarray(np.roll(base, i * 7, axis=1)).save(buf, "JPEG", quality=85)
            sents = [{"text": " ".join(r.choice(WORDS) for _ in range(r.randint(10, 18))).capitalize() + ".",
                      "position": j} for j in range(sentences)]
            w.write(Sample(f"p{i:07d}", buf.getvalue(), " ".join(s["text"] for s in sents), ext="jpg",
                           meta={"captioner": "bench", "source": "i2t", "sentences": sents}))
    return captions * sentences


def flops_per_sentence(model, processor, image_size: int, sentences: int) -> dict:
    """FLOPs per sentence of the reuse path: (text params x prefix tokens + vision params x patches) once per caption,
    text params x the sentence's own tokens (~1.3 per word plus the chat's closing tokens) per sentence; x2."""
    import numpy as np
    from PIL import Image

    n_vis = sum(p.numel() for p in model.model.visual.parameters())
    n_txt = sum(p.numel() for n, p in model.model.language_model.named_parameters() if "embed" not in n)
    image = Image.fromarray(np.zeros((image_size, image_size, 3), np.uint8))
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Is this sentence correct?"}]}]
    text = processor.apply_chat_template(chat, add_generation_prompt=True)
    inputs = processor(text=[text], images=[image], return_tensors="pt")
    prefix = int(inputs["input_ids"].shape[1])
    patches = int(inputs["pixel_values"].shape[0])
    cont = 14 * 1.3 + 8
    per_caption = n_txt * prefix + n_vis * patches
    return {"flops_per_sentence_G": round(2 * (per_caption / sentences + n_txt * cont) / 1e9, 2),
            "prefix_tokens": prefix, "vision_patches": patches, "sentence_tokens_est": round(cont, 1),
            "params_text_M": round(n_txt / 1e6, 1), "params_vision_M": round(n_vis / 1e6, 1)}


def run_cli(args: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess]:
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "halsift.launch.cli", *args], env=env, capture_output=True, text=True)
    return time.perf_counter() - t, proc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=("2b", "tiny"), default="tiny")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--captions", type=int, default=None, help="default 16 tiny / 256 2b")
    ap.add_argument("--sentences", type=int, default=5, help="sentences per caption")
    ap.add_argument("--image-size", type=int, default=None, help="default 112 tiny / 448 2b")
    ap.add_argument("--batch-size", type=int, default=64, help="score --batch-size")
    ap.add_argument("--decode-workers", type=int, default=None, help="score --decode-workers (default 4 on CUDA, 0)")
    ap.add_argument("--peak-tflops", type=float, default=None, help="bf16 dense peak (default: from the card's name)")
    ap.add_argument("--json", default="", help="write the figures here (after every step)")
    a = ap.parse_args(argv)
    gpu = a.device.startswith("cuda")
    captions = a.captions or (256 if a.size == "2b" else 16)
    image_size = a.image_size or (448 if a.size == "2b" else 112)
    workers = a.decode_workers if a.decode_workers is not None else (4 if gpu else 0)
    res: dict = {"size": a.size, "device": a.device, "captions": captions, "sentences_per_caption": a.sentences,
                 "image_size": image_size, "batch_size": a.batch_size, "decode_workers": workers}

    def save() -> None:
        if a.json:
            Path(a.json).write_text(json.dumps(res, indent=1))

    import torch

    sys.path.insert(0, str(HERE))
    from judge_throughput import build

    tmp = Path(tempfile.mkdtemp(prefix="halsift-product-"))
    t = time.perf_counter()
    dtype = "bfloat16" if gpu else "float32"
    model, processor = build("qwen2-vl-2b-config" if a.size == "2b" else "qwen2-vl", "tiny", image_size, a.device,
                             dtype)
    res["build_s"] = round(time.perf_counter() - t, 1)
    res.update(flops_per_sentence(model, processor, image_size, a.sentences))
    t = time.perf_counter()
    model.save_pretrained(tmp / "judge")
    processor.save_pretrained(tmp / "judge")
    res["save_s"] = round(time.perf_counter() - t, 1)
    del model
    if gpu:
        torch.cuda.empty_cache()
    t = time.perf_counter()
    n = write_shards(tmp / "data", captions, a.sentences, image_size, per_shard=max(1, captions // 8))
    res["shards_s"] = round(time.perf_counter() - t, 1)
    save()
    print(f"judge {a.size} built in {res['build_s']} s, saved in {res['save_s']} s; {captions} captions x "
          f"{a.sentences} sentences of {image_size} px in {res['shards_s']} s", flush=True)

    env = {**os.environ, "HALSIFT_QUIET": "1"}
    spec = f"vlm:model={tmp / 'judge'},mode=logits,dtype={dtype},batch_size={a.batch_size}"
    wall, proc = run_cli(["score", "--detector", spec, "--data", str(tmp / "data"), "--out", str(tmp / "scores"),
                          "--batch-size", str(a.batch_size), "--device", a.device, "--no-progress",
                          "--decode-workers", str(workers)], env)
    if proc.returncode != 0:
        res["score"] = {"returncode": proc.returncode, "stderr_tail": proc.stderr[-2000:]}
        save()
        print(proc.stderr[-2000:], file=sys.stderr)
        return 1
    m = json.loads((tmp / "scores" / "_manifest.json").read_text())
    res["score"] = {"command": f"halsift score --detector {spec} --batch-size {a.batch_size} --decode-workers "
                               f"{workers}", "wall_s": round(wall, 2), "sentences": m["sentences"],
                    "sentences_per_s": m["sentences_per_s"], "scoring_time_s": m["scoring_time_s"],
                    "end_to_end_sentences_per_s": round(m["sentences"] / wall, 2), "time_share": m["time_share"]}
    peak, source = peak_tflops(torch.cuda.get_device_name(0) if gpu else "cpu", a.peak_tflops)
    achieved = res["flops_per_sentence_G"] * 1e9 * m["sentences_per_s"]
    res.update(achieved_tflops=round(achieved / 1e12, 2), peak_tflops_bf16=peak, peak_source=source,
               percent_of_peak=round(100 * achieved / (peak * 1e12), 2) if peak else None)
    save()
    print(f"score: {m['sentences']} sentences, {m['sentences_per_s']} sentences/s in the scoring loop, "
          f"{res['score']['end_to_end_sentences_per_s']} end to end ({wall:.1f} s with start-up and model load); "
          f"{res['flops_per_sentence_G']} GFLOP/sentence -> {res['achieved_tflops']} TFLOP/s = "
          f"{res['percent_of_peak']}% of the bf16 peak {peak} TFLOP/s ({source})", flush=True)

    wall, proc = run_cli(["select", "--scores", str(tmp / "scores"), "--data", str(tmp / "data"), "--out",
                          str(tmp / "selected"), "--keep", "0.5", "--unit", "caption", "--no-progress"], env)
    res["select"] = {"command": "halsift select --keep 0.5 --unit caption", "wall_s": round(wall, 2),
                     "returncode": proc.returncode}
    if proc.returncode != 0:
        res["select"]["stderr_tail"] = proc.stderr[-2000:]
    else:
        sm = json.loads((tmp / "selected" / "manifest.json").read_text())
        res["select"].update(kept_units=sm.get("kept_units"), candidates=sm.get("candidates"),
                             select_wall_s=sm.get("wall_time_s"))
        res["select"]["sentences_per_s"] = round(n / wall, 1)
    res["end_to_end_s"] = round(sum(res.get(k, 0) for k in ("build_s", "save_s", "shards_s"))
                                + res["score"]["wall_s"] + wall, 1)
    save()
    print(f"select: {wall:.1f} s ({res['select'].get('sentences_per_s')} sentences/s), returncode {proc.returncode}",
          flush=True)
    shutil.rmtree(tmp, ignore_errors=True)  # the 2B judge takes ~4.4 GB of disk
    return 0 if proc.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
