"""`halsift train clip` / `halsift eval retrieval` end to end on tiny shards (CPU, halsift-tiny, 32-px images)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from filtering_data import write_png_shards

from halsift.corpus.shards import Sample, ShardWriter
from halsift.launch.cli import main

COLORS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220), "yellow": (230, 220, 30),
          "white": (240, 240, 240), "black": (10, 10, 10)}
NAMES = list(COLORS)


def _png(fg: str, bg: str, pos: int) -> bytes:
    from PIL import Image

    a = np.zeros((32, 32, 3), np.uint8)
    a[:] = COLORS[bg]
    y, x = divmod(pos, 2)
    a[y * 16:(y + 1) * 16, x * 16:(x + 1) * 16] = COLORS[fg]
    buf = io.BytesIO()
    Image.fromarray(a).save(buf, "PNG")
    return buf.getvalue()


def _pair(rng, i: int) -> tuple[bytes, str, str, str, int]:
    fg, bg = rng.choice(len(NAMES), size=2, replace=False)
    pos = int(rng.integers(4))
    where = ["top left", "top right", "bottom left", "bottom right"][pos]
    return _png(NAMES[fg], NAMES[bg], pos), f"a {NAMES[fg]} square at the {where} on {NAMES[bg]}", NAMES[fg], \
        NAMES[bg], pos


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """shards/: 4 shards x 16 samples (one with a corrupt image); retrieval/: 12 images x 2 captions."""
    root = tmp_path_factory.mktemp("tiny")
    rng = np.random.default_rng(0)
    pairs = [_pair(rng, i)[:2] for i in range(64)]
    pairs[5] = (b"\x89PNG not really", pairs[5][1])  # one corrupt image
    write_png_shards(root / "shards", pairs, maxcount=16)
    (root / "retrieval" / "images").mkdir(parents=True)
    with open(root / "retrieval" / "retrieval.jsonl", "w") as f:
        for i in range(12):
            img, cap, fg, bg, _ = _pair(rng, i)
            (root / "retrieval" / "images" / f"{i}.png").write_bytes(img)
            f.write(json.dumps({"image": f"images/{i}.png", "captions": [cap, f"{fg} on {bg}"]}) + "\n")
    return root


def _args(tiny: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "clip", "--data", str(tiny / "shards"), "--out", str(out), "--model", "halsift-tiny",
            "--batch-size", "8", "--lr", "1e-3", "--warmup", "1", "--workers", "0", "--wandb-mode", "disabled",
            "--retrieval", str(tiny / "retrieval"), *extra]


def _lines(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


def _env() -> dict:
    env = dict(os.environ, HALSIFT_QUIET="1", WANDB_MODE="disabled", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    return env


def test_train_writes_checkpoints_metrics_and_loads_back(tiny, tmp_path):
    import open_clip
    import torch
    from safetensors.torch import load_file

    from halsift.eval.metrics.retrieval import evaluate_retrieval

    out = tmp_path / "run"
    assert main(_args(tiny, out, "--steps", "4", "--checkpoint-every", "2", "--eval-every", "2", "--log-every",
                      "2")) == 0
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert ckpts == ["step_000002", "step_000004"]
    for c in ckpts:
        assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl", "state.json"} <= \
            {p.name for p in (out / "checkpoints" / c).iterdir()}  # accelerate's save_state layout
    lines = _lines(out)
    train = [x for x in lines if "train/loss" in x]
    evals = [x for x in lines if "i2t/r@5" in x]
    assert [x["step"] for x in train] == [2, 4]  # only log steps read the loss from the device
    assert [x["step"] for x in evals] == [2, 4]
    assert all(np.isfinite(x["train/loss"]) and x["train/samples_per_s"] > 0 for x in train)
    assert train[-1]["train/skipped_samples"] >= 1  # the corrupt png (counted each time the stream reads it)
    assert json.loads((out / "run_info.json").read_text())["world_size"] == 1

    weights = out / "final" / "open_clip_model.safetensors"
    model, _, preprocess = open_clip.create_model_and_transforms("halsift-tiny", pretrained=str(weights))
    saved = load_file(str(weights))
    assert all(torch.equal(v, saved[k]) for k, v in model.state_dict().items())
    init = _seeded_init(0)  # the run's own initial weights (--seed 0; pinned by test_lr_zero_keeps_the_seeded_init)
    moved = [k for k, v in init.items() if not torch.equal(v, saved[k])]
    assert {"visual.conv1.weight", "token_embedding.weight", "text_projection", "logit_scale"} <= set(moved)
    assert len(moved) >= 0.9 * len(init), sorted(set(init) - set(moved))  # trained weights, not init
    again = evaluate_retrieval(model, preprocess, open_clip.get_tokenizer("halsift-tiny"), tiny / "retrieval")
    for k in ("i2t/r@1", "i2t/r@5", "t2i/r@1", "t2i/r@5"):
        assert again[k] == pytest.approx(evals[-1][k], abs=1e-6), k

    # the same weights through the CLI
    ev = tmp_path / "eval"
    assert main(["eval", "retrieval", "--model", "halsift-tiny", "--pretrained", str(weights),
                 "--data", str(tiny / "retrieval"), "--out", str(ev)]) == 0
    metrics = json.loads((ev / "metrics.json").read_text())
    assert metrics["t2i/r@5"] == pytest.approx(evals[-1]["t2i/r@5"], abs=1e-6)
    assert "R@5" in (ev / "report.md").read_text()
    # the in-loop evals also in CLIP_benchmark's layout (0-1 scale; image_retrieval = text->image)
    cb = json.loads((out / "clip_benchmark" / "step_000004.json").read_text())
    assert cb["task"] == "zeroshot_retrieval" and cb["model"] == "halsift-tiny"
    assert cb["metrics"]["image_retrieval_recall@5"] == pytest.approx(evals[-1]["t2i/r@5"] / 100)


def _seeded_init(seed: int) -> dict:
    """halsift-tiny's initial weights in a run with ``--seed seed`` (the trainer seeds, then builds the model)."""
    import open_clip
    import torch

    from halsift.training.clip_config import ensure_model_configs

    ensure_model_configs()
    torch.manual_seed(seed)
    return open_clip.create_model("halsift-tiny").state_dict()


def test_lr_zero_keeps_the_seeded_init(tiny, tmp_path):
    """With ``--lr 0`` the final weights are exactly the seeded init: what the tests above compare against."""
    import torch
    from safetensors.torch import load_file

    out = tmp_path / "lr0"
    assert main(_args(tiny, out, "--steps", "2", "--lr", "0", "--retrieval", "", "--seed", "3")) == 0
    saved, init = load_file(str(out / "final" / "open_clip_model.safetensors")), _seeded_init(3)
    assert saved.keys() == init.keys()
    assert all(torch.equal(v, saved[k]) for k, v in init.items())
    assert not torch.equal(_seeded_init(4)["visual.conv1.weight"], init["visual.conv1.weight"])


def test_default_clip_loss_learns_the_toy_task(tiny, tmp_path):
    """20 steps of the default (CLIP) loss on the colour-square shards: on 32 held-out pairs the correct caption
    ranks far higher and the contrastive loss is lower than at init; the logged training loss falls. (Run with
    --seed 0-7: the held-out mean rank fell from ~15.5, chance, by 7.1-13.6, its loss by 0.65-1.8 and the mean of
    the first vs last three training losses by 0.77-1.9; the margins asserted are under half the smallest.)"""
    import open_clip
    import torch
    from PIL import Image
    from safetensors.torch import load_file

    out = tmp_path / "learn"
    assert main(_args(tiny, out, "--steps", "20", "--batch-size", "16", "--lr", "2e-3", "--log-every", "1",
                      "--retrieval", "")) == 0
    rng = np.random.default_rng(99)  # pairs the shards do not hold (their rng is seed 0)
    held = [_pair(rng, i)[:2] for i in range(32)]
    model, _, preprocess = open_clip.create_model_and_transforms("halsift-tiny")
    tok = open_clip.get_tokenizer("halsift-tiny")
    images = torch.stack([preprocess(Image.open(io.BytesIO(png)).convert("RGB")) for png, _ in held])
    texts, labels = tok([cap for _, cap in held]), torch.arange(len(held))

    def held_out(weights: dict) -> tuple[float, float]:
        """(mean rank of the right caption among the 32, symmetric InfoNCE at the model's temperature)."""
        model.load_state_dict(weights)
        model.eval()
        with torch.no_grad():
            sim = model.encode_image(images, normalize=True) @ model.encode_text(texts, normalize=True).T
            logits = model.logit_scale.exp() * sim
        loss = (torch.nn.functional.cross_entropy(logits, labels) +
                torch.nn.functional.cross_entropy(logits.T, labels)) / 2
        return float((sim > sim.diag()[:, None]).sum(1).float().mean()), float(loss)

    rank0, loss0 = held_out(_seeded_init(0))
    rank1, loss1 = held_out(load_file(str(out / "final" / "open_clip_model.safetensors")))
    assert rank1 <= rank0 - 3 and loss1 <= loss0 - 0.2, (rank0, rank1, loss0, loss1)
    train = [x["train/loss"] for x in _lines(out) if "train/loss" in x]
    assert len(train) == 20 and np.mean(train[-3:]) <= np.mean(train[:3]) - 0.3, train


def test_resume_after_sigkill_matches_straight_run(tiny, tmp_path):
    common = ["--steps", "6", "--checkpoint-every", "3", "--workers", "2", "--grad-accum", "2", "--lr", "1e-3",
              "--log-every", "1"]
    straight = tmp_path / "straight"
    assert main(_args(tiny, straight, *common)) == 0

    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "halsift.launch.cli", *_args(tiny, killed, *common)]
    proc = subprocess.run(cmd, env={**_env(), "HALSIFT_FAULT_KILL_AFTER_STEP": "4"}, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert [p.name for p in (killed / "checkpoints").iterdir()] == ["step_000003"]
    assert not (killed / "final").exists()
    # a half-written checkpoint (temp folder) and a step folder without state.json must never be picked up
    half = killed / "checkpoints" / ".step_000005.tmp-12345"
    half.mkdir()
    (half / "model.safetensors").write_bytes(b"garbage")
    (half / "state.json").write_text(json.dumps({"step": 5}))
    partial = killed / "checkpoints" / "step_000005"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"garbage")

    assert main(_args(tiny, killed, *common, "--resume")) == 0
    a, b = _lines(straight), _lines(killed)
    assert [x["step"] for x in b if "train/loss" in x] == [1, 2, 3, 4, 5, 6]  # lines after step 3 rewritten
    la = {x["step"]: x for x in a if "train/loss" in x}
    lb = {x["step"]: x for x in b if "train/loss" in x}
    for s in (4, 5, 6):
        assert lb[s]["train/loss"] == pytest.approx(la[s]["train/loss"], rel=1e-4, abs=1e-5), s
    ea, eb = a[-1], b[-1]
    assert ea["step"] == eb["step"] == 6
    for k in ("i2t/r@1", "i2t/r@5", "t2i/r@1", "t2i/r@5"):
        assert eb[k] == pytest.approx(ea[k], abs=1e-6), k
    assert json.loads((killed / "checkpoints" / "step_000006" / "state.json").read_text())["step"] == 6


def test_nan_loss_stops_cleanly_with_last_checkpoint_intact(tiny, tmp_path, monkeypatch, capsys):
    import torch
    from safetensors.torch import load_file

    from halsift.training import clip_train

    real = clip_train.build_loss
    calls = {"n": 0}

    def poisoned(cfg, rank, world):
        loss = real(cfg, rank, world)

        def fn(feats):
            calls["n"] += 1
            value = loss(feats)
            return value * float("nan") if calls["n"] >= 3 else value
        return fn

    monkeypatch.setattr(clip_train, "build_loss", poisoned)
    out = tmp_path / "nan"
    assert main(_args(tiny, out, "--steps", "6", "--checkpoint-every", "2", "--retrieval", "")) == 1
    err = capsys.readouterr().err
    assert "loss is nan at step 3" in err and "step_000002" in err
    ckpts = sorted((out / "checkpoints").iterdir())
    assert [p.name for p in ckpts] == ["step_000002"]
    sd = load_file(str(ckpts[0] / "model.safetensors"))
    assert all(torch.isfinite(v).all() for v in sd.values())
    assert json.loads((ckpts[0] / "state.json").read_text())["step"] == 2
    assert not (out / "final").exists()
    assert _lines(out)[-1]["event"] == "nonfinite_loss"


def test_siglip_with_locked_image_tower(tiny, tmp_path):
    import open_clip
    import torch

    out = tmp_path / "siglip"
    assert main(_args(tiny, out, "--steps", "2", "--loss", "siglip", "--lock-image", "--retrieval", "",
                      "--seed", "7")) == 0
    # the arch has no logit bias of its own: open_clip loads the SigLIP fine-tune given init_logit_bias
    model, _, _ = open_clip.create_model_and_transforms(
        "halsift-tiny", pretrained=str(out / "final" / "open_clip_model.safetensors"), init_logit_bias=0.0)
    torch.manual_seed(7)  # the trainer seeds before building the model: the same init
    init = open_clip.create_model("halsift-tiny", init_logit_bias=-10.0)
    assert float(model.logit_bias.detach()) != -10.0  # SigLIP's bias was trained
    for (n, p), (_, q) in zip(model.named_parameters(), init.named_parameters()):
        if n.startswith("visual."):
            assert torch.equal(p, q), n  # locked
    assert not torch.equal(model.token_embedding.weight, init.token_embedding.weight)
    assert all(np.isfinite(x["train/loss"]) for x in _lines(out) if "train/loss" in x)


def test_two_process_cpu_ddp(tiny, tmp_path):
    out = tmp_path / "ddp"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "halsift.launch.cli", *_args(tiny, out, "--steps", "2", "--workers", "1",
                                              "--data", str(tiny / "shards" / "{000000..000003}.tar"))]
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads((out / "run_info.json").read_text())
    assert info["world_size"] == 2 and "MULTI_CPU" in info["distributed_type"]
    assert (out / "final" / "open_clip_model.safetensors").exists()
    state = json.loads((out / "checkpoints" / "step_000002" / "state.json").read_text())
    assert state["world_size"] == 2 and state["samples_seen"] == 2 * 8 * 2


def _unique_shards(folder: Path, n_shards: int, per_shard: int, prefix: str) -> None:
    with ShardWriter(folder, maxcount=per_shard) as w:
        for i in range(n_shards * per_shard):
            w.write(Sample(key=f"{prefix}{i:04d}", image=_png("red", "blue", 0), caption=f"{prefix}{i}", ext="png",
                           meta={"captioner": "test", "source": "i2t"}))


def _read(ds, n: int) -> list[str]:
    it = iter(ds)
    out: list[str] = []
    while len(out) < n:
        out.extend(next(it)["text"])
    return out[:n]


def test_ranks_and_workers_read_disjoint_shards(tmp_path, monkeypatch):
    """Each (rank, worker) of a 2 x 2 split reads its own shards: one epoch covers every sample exactly once."""
    import torch

    from halsift.training.clip_data import ShardStream

    _unique_shards(tmp_path / "u", n_shards=8, per_shard=3, prefix="c")
    seen: list[str] = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("NUM_WORKERS", "2")
    for rank in range(2):
        for worker in range(2):
            monkeypatch.setenv("RANK", str(rank))
            monkeypatch.setenv("WORKER", str(worker))
            ds = ShardStream([str(tmp_path / "u")], preprocess=lambda im: torch.zeros(1),
                             tokenizer=lambda caps: caps, batch_size=2, shuffle_buffer=0, seed=3)
            seen.extend(_read(ds, 6))  # 2 shards x 3 samples = this reader's epoch
    assert sorted(seen) == sorted(f"c{i}" for i in range(24))
    monkeypatch.setenv("NUM_WORKERS", "5")  # 10 readers > 8 shards: refused rather than duplicated
    with pytest.raises(ValueError, match="8 shard"):
        _read(ShardStream([str(tmp_path / "u")], lambda im: torch.zeros(1), lambda c: c, 2), 1)


def test_mixture_follows_weights(tmp_path):
    import torch

    from halsift.training.clip_data import ShardStream

    _unique_shards(tmp_path / "a", 2, 5, "a")
    _unique_shards(tmp_path / "b", 2, 5, "b")
    ds = ShardStream([str(tmp_path / "a"), str(tmp_path / "b")], lambda im: torch.zeros(1), lambda c: c,
                     batch_size=50, weights=[3, 1], shuffle_buffer=0)
    got = _read(ds, 2000)
    frac_a = sum(c.startswith("a") for c in got) / len(got)
    assert abs(frac_a - 0.75) < 0.04  # binomial sd ~0.01


def test_bad_flags_exit_2(tiny, tmp_path, capsys):
    assert main(["train", "clip", "--data", str(tiny / "shards"), "--out", str(tmp_path), "--model", "nope"]) == 2
    assert "--model" in capsys.readouterr().err
    assert main(["train", "clip", "--data", str(tiny / "shards"), "--out", str(tmp_path), "--loss", "l2"]) == 2
    assert "--loss" in capsys.readouterr().err
    assert main(["train", "clip", "--data", str(tmp_path / "missing"), "--out", str(tmp_path), "--model",
                 "halsift-tiny"]) == 2
    assert main(["eval", "retrieval", "--model", "halsift-tiny", "--data", str(tmp_path / "none"),
                 "--out", str(tmp_path / "ev")]) == 2


def test_retrieval_and_bench_detection_logged_together(synth_world, tmp_path):
    """On the synthetic world: one metrics line holds retrieval recall AND the model's own detection AUROC, and
    the AUROC matches sklearn on raw image-sentence cosine similarities of the saved model."""
    import open_clip
    import torch
    from PIL import Image
    from sklearn.metrics import roc_auc_score

    from halsift.corpus.bench import read_bench

    out = tmp_path / "run"
    bench = synth_world / "bench" / "bench.jsonl"
    assert main(["train", "clip", "--data", str(synth_world / "corpus"), "--out", str(out), "--model",
                 "halsift-tiny", "--batch-size", "16", "--steps", "2", "--workers", "0", "--wandb-mode", "disabled",
                 "--retrieval", str(synth_world / "retrieval"), "--bench", str(bench)]) == 0
    last = _lines(out)[-1]
    assert last["step"] == 2 and "i2t/r@5" in last and "t2i/r@5" in last and "auroc/mean" in last
    assert not (out / "eval_tmp" / "bench_step_000002").exists()

    model, _, preprocess = open_clip.create_model_and_transforms(
        "halsift-tiny", pretrained=str(out / "final" / "open_clip_model.safetensors"))
    tok = open_clip.get_tokenizer("halsift-tiny")
    rows = [r for r in read_bench(bench) if r.label in ("correct", "incorrect")]
    with torch.no_grad():
        paths = sorted({r.image for r in rows})
        ims = torch.stack([preprocess(Image.open(bench.parent / p).convert("RGB")) for p in paths])
        img = dict(zip(paths, torch.nn.functional.normalize(model.encode_image(ims), dim=-1)))
        txt = torch.nn.functional.normalize(model.encode_text(tok([r.sentence for r in rows])), dim=-1)
    by_gen: dict[str, tuple[list, list]] = {}
    for r, t in zip(rows, txt):
        labels, scores = by_gen.setdefault(r.generator, ([], []))
        labels.append(r.label == "correct")
        scores.append(float(img[r.image] @ t))
    want = {g: 100 * roc_auc_score(l, s) for g, (l, s) in by_gen.items() if 0 < sum(l) < len(l)}
    for g, v in want.items():
        assert last[f"auroc/{g}"] == pytest.approx(v, abs=0.5), g
    assert last["auroc/mean"] == pytest.approx(sum(want.values()) / len(want), abs=0.5)


def test_more_workers_than_shards_uses_fewer_workers(tiny, tmp_path):
    out = tmp_path / "w"
    two = str(tiny / "shards" / "{000000..000001}.tar")
    with pytest.warns(UserWarning, match="using 2 dataloader worker"):
        args = _args(tiny, out, "--steps", "1", "--workers", "8", "--retrieval", "")
        args[args.index("--data") + 1] = two  # (a repeated --data would add a second source)
        assert main(args) == 0
    assert json.loads((out / "checkpoints" / "step_000001" / "state.json").read_text())["workers"] == 2
