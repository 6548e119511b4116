"""`halsift eval zeroshot`: CLIP_benchmark's metrics and classifier, its wds layout, one-line errors."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest

from halsift.eval.metrics.zeroshot import class_embedding, zeroshot_logits, zeroshot_metrics
from halsift.launch.cli import main

CLASSES = ["red circle", "blue square", "green star", "cat", "dog", "yellow triangle"]
TEMPLATES = ["a photo of a {c}.", "a drawing of a {c}."]
# CLIP_benchmark 1.6.2's clip_benchmark.metrics.zeroshot_classification.evaluate (amp=False) on wds_fixture with
# tiny_model, computed by actually running it: acc1, acc5, mean_per_class_recall on its 0-1 scale. The test below
# checks its own written-out reference against it (and against clip_benchmark itself whenever it is installed).
REFERENCE = {"acc1": 0.125, "acc5": 0.625, "mean_per_class_recall": 0.16666666666666666}


def wds_fixture(root, n: int = 24, classnames: bool = True):
    """A real-layout CLIP_benchmark wds folder: 24 random 40x40 PNGs over 6 classes (3 images each, 9 of
    the last: imbalanced, so mean per-class recall differs from accuracy) in 3 shards of <= 10."""
    from PIL import Image

    from halsift.corpus.clip_benchmark_wds import write_wds_split

    rng = np.random.default_rng(0)
    samples = []
    for i in range(n):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (40, 40, 3), dtype=np.uint8)).save(buf, format="PNG")
        samples.append({"__key__": f"s{i:07d}", "png": buf.getvalue(), "cls": str(min(i // 3, 5)).encode()})
    write_wds_split(root, "test", samples, "classification", maxcount=10)
    if classnames:
        (root / "classnames.txt").write_text("\n".join(CLASSES) + "\n")
    (root / "zeroshot_classification_templates.txt").write_text("\n".join(TEMPLATES) + "\n")
    return root


def tiny_model():
    """halsift-tiny, randomly initialised from torch seed 0 (the same weights on every run)."""
    import torch

    from halsift.filtering.models.clip_models import load_open_clip

    torch.manual_seed(0)
    model, _, preprocess = load_open_clip("halsift-tiny", None, device="cpu")
    return model.eval(), preprocess


def test_metrics_on_handmade_logits():
    logits = np.array([[9, 1, 2, 3, 4, 5],   # label 0: top-1 hit
                       [9, 8, 2, 3, 4, 5],   # label 1: rank 2 (top-5 hit)
                       [9, 8, 7, 6, 5, 1],   # label 5: rank 6 (miss at 5)
                       [1, 2, 3, 4, 9, 5]],  # label 4: top-1 hit
                      dtype=float)
    m = zeroshot_metrics(logits, [0, 1, 5, 4])
    assert m["acc1"] == pytest.approx(50.0) and m["acc5"] == pytest.approx(75.0)
    # per-class recall over the classes present: 0 -> 1, 1 -> 0, 5 -> 0, 4 -> 1 => 50
    assert m["mean_per_class_recall"] == pytest.approx(50.0)
    # imbalanced: 3 samples of class 0 all right, 1 of class 1 wrong: acc1 75 but mean recall 50
    m2 = zeroshot_metrics(np.array([[1.0, 0, 0], [1, 0, 0], [1, 0, 0], [1, 0, 0]]), [0, 0, 0, 1])
    assert (m2["acc1"], m2["mean_per_class_recall"]) == (pytest.approx(75.0), pytest.approx(50.0))
    assert math.isnan(m2["acc5"])  # fewer than 5 classes: CLIP_benchmark writes NaN
    assert zeroshot_metrics(np.array([[0.2, 0.8], [0.9, 0.1]]), [1, 1])["acc1"] == pytest.approx(50.0)


def test_classifier_is_the_mean_of_normalised_prompt_embeddings():
    w = class_embedding([[3.0, 0.0], [0.0, 0.5]])  # normalised rows (1,0) and (0,1): mean (.5,.5) -> unit
    assert w == pytest.approx([2 ** -0.5, 2 ** -0.5])
    assert zeroshot_logits([[2.0, 0.0]], np.array([[1.0], [0.0]]))[0, 0] == pytest.approx(100.0)


def _reference_accuracy(output, target, topk=(1,)):
    """CLIP_benchmark 1.6.2's ``accuracy``, line for line, but for ``.item()`` where it calls ``float()`` on a
    1-element array (which numpy 2 refuses: the released function raises TypeError there)."""
    pred = output.topk(max(topk), 1, True, True)[1].t()
    correct = pred.eq(target.view(1, -1).expand_as(pred))
    n = len(target)
    return [correct[:k].reshape(-1).float().sum(0, keepdim=True).cpu().numpy().item() / n for k in topk]


def _from_scratch(root, model, preprocess) -> tuple[dict, np.ndarray, np.ndarray]:
    """CLIP_benchmark 1.6's zero-shot classification written out here, reading nothing through halsift: the wds
    split's tars in shard order (python's tarfile), a class's weight the normalised mean of its normalised prompt
    embeddings (open_clip's tokenizer), logits 100 * image @ weights, top-k accuracy, and mean per-class recall as
    sklearn's balanced accuracy of the argmax. Returns (metrics on its 0-1 scale, logits, targets)."""
    import tarfile

    import open_clip
    import torch
    from PIL import Image
    from sklearn.metrics import balanced_accuracy_score

    classes = (root / "classnames.txt").read_text().splitlines()
    templates = (root / "zeroshot_classification_templates.txt").read_text().splitlines()
    images, target = [], []
    for i in range(int((root / "test" / "nshards.txt").read_text())):
        with tarfile.open(root / "test" / f"{i}.tar") as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
        for key in dict.fromkeys(n.split(".", 1)[0] for n in members):
            images.append(Image.open(io.BytesIO(members[f"{key}.png"])).convert("RGB"))
            target.append(int(members[f"{key}.cls"]))
    tok = open_clip.get_tokenizer("halsift-tiny")
    with torch.no_grad():
        weights = []
        for c in classes:
            e = model.encode_text(tok([t.format(c=c) for t in templates]))
            e = (e / e.norm(dim=-1, keepdim=True)).mean(dim=0)
            weights.append(e / e.norm())
        feats = model.encode_image(torch.stack([preprocess(im) for im in images]))
        feats = feats / feats.norm(dim=-1, keepdim=True)
        logits = (100.0 * feats @ torch.stack(weights, dim=1)).numpy()
    target = np.array(target)
    top = np.argsort(-logits, axis=1)
    metrics = {"acc1": float(np.mean(top[:, 0] == target)),
               "acc5": float(np.mean((top[:, :5] == target[:, None]).any(axis=1))) if len(classes) >= 5 else math.nan,
               "mean_per_class_recall": float(balanced_accuracy_score(target, top[:, 0]))}
    return metrics, logits, target


def test_equals_clip_benchmark(tmp_path, monkeypatch):
    """Our metrics and logits equal CLIP_benchmark's zero-shot classification on the same model and wds folder:
    always against the reference written out in this test (:func:`_from_scratch`), and against clip_benchmark
    itself when it is installed (which must agree with the written-out reference too)."""
    import torch

    from halsift.corpus.classification import read_classification
    from halsift.eval.runs.zeroshot import evaluate_zeroshot
    from halsift.filtering.models.clip_tokenizer import get_tokenizer

    root = wds_fixture(tmp_path / "fix")
    model, preprocess = tiny_model()
    ours, logits, target = evaluate_zeroshot(model, preprocess, get_tokenizer("halsift-tiny"),
                                             read_classification(root), "cpu", 8, "fp32", return_logits=True)
    ref, ref_logits, ref_target = _from_scratch(root, model, preprocess)
    assert np.array_equal(ref_target, target)
    np.testing.assert_allclose(logits, ref_logits, atol=1e-3)
    assert ref == pytest.approx(REFERENCE)  # what the released clip_benchmark gave on this fixture
    assert len({round(v, 6) for v in ref.values()}) == 3, "acc1, acc5 and mean recall must differ to be told apart"
    for k in ("acc1", "acc5", "mean_per_class_recall"):
        assert ours[f"zeroshot/{k}"] == pytest.approx(100 * ref[k], abs=0.1), k
    try:
        import open_clip
        from clip_benchmark.datasets.builder import build_wds_dataset
        from clip_benchmark.metrics import zeroshot_classification as zsc
    except ImportError:
        return
    ds = build_wds_dataset("wds/fix", transform=preprocess, split="test", data_dir=str(root))
    dl = torch.utils.data.DataLoader(ds.batched(8), batch_size=None, shuffle=False, num_workers=0)
    dl.dataset.classes = ds.classes
    tok = open_clip.get_tokenizer("halsift-tiny")
    monkeypatch.setattr(zsc, "accuracy", _reference_accuracy)
    cb = zsc.evaluate(model, dl, tok, ds.classes, ds.templates, "cpu", amp=False)
    clf = zsc.zero_shot_classifier(model, tok, ds.classes, ds.templates, "cpu", amp=False)
    cb_logits, cb_target = zsc.run_classification(model, clf, dl, "cpu", amp=False)
    assert np.array_equal(cb_target.numpy(), target)
    np.testing.assert_allclose(logits, cb_logits.numpy(), atol=1e-3)
    assert cb == pytest.approx(ref)


def _run(args: list[str], capsys) -> tuple[int, str]:
    code = main(["eval", "zeroshot", "--model", "halsift-tiny", "--pretrained", "random", "--device", "cpu", *args])
    return code, capsys.readouterr().err.strip()


def test_cli_writes_metrics_and_clip_benchmark_json(tmp_path, capsys):
    root = wds_fixture(tmp_path / "fix")
    assert _run(["--data", str(root), "--out", str(tmp_path / "o"), "--batch-size", "5"], capsys)[0] == 0
    m = json.loads((tmp_path / "o" / "metrics.json").read_text())
    assert set(m) == {"zeroshot/acc1", "zeroshot/acc5", "zeroshot/mean_per_class_recall", "zeroshot/images",
                      "zeroshot/classes"} and (m["zeroshot/images"], m["zeroshot/classes"]) == (24, 6)
    cb = json.loads((tmp_path / "o" / "clip_benchmark.json").read_text())
    assert cb["task"] == "zeroshot_classification" and cb["dataset"] == "wds/fix"
    assert cb["metrics"]["acc1"] == pytest.approx(m["zeroshot/acc1"] / 100)


def test_imagefolder_layout_gives_the_same_metrics(tmp_path, capsys):
    """The fixture's images as an ImageFolder (class folders in label order) score exactly as the wds folder."""
    import tarfile

    root = wds_fixture(tmp_path / "fix")
    folder = tmp_path / "folder"
    for shard in sorted((root / "test").glob("*.tar")):
        with tarfile.open(shard) as tar:
            members = {m.name: tar.extractfile(m).read() for m in tar}
        for name, data in members.items():
            if name.endswith(".png"):
                label = int(members[name[:-4] + ".cls"])
                (folder / f"c{label}").mkdir(parents=True, exist_ok=True)
                (folder / f"c{label}" / name).write_bytes(data)
    (folder / "classnames.txt").write_text("\n".join(CLASSES) + "\n")
    (folder / "zeroshot_classification_templates.txt").write_text("\n".join(TEMPLATES) + "\n")
    for data, out in ((root, "a"), (folder, "b")):
        assert _run(["--data", str(data), "--out", str(tmp_path / out)], capsys)[0] == 0
    a, b = (json.loads((tmp_path / o / "metrics.json").read_text()) for o in "ab")
    assert a == pytest.approx(b)


@pytest.mark.parametrize("case, message", [
    ("no classnames", r"classnames\.txt: missing \(class names"),
    ("empty classnames", r"classnames\.txt: empty"),
    ("label out of range", r"0\.tar: sample 's0000000': label 9 is not in \[0, 6\)"),
    ("no templates", r"zeroshot_classification_templates\.txt: missing"),
])
def test_bad_input_is_one_line_naming_the_file(tmp_path, capsys, case, message):
    import re

    root = wds_fixture(tmp_path / "fix", classnames=case != "no classnames")
    if case == "empty classnames":
        (root / "classnames.txt").write_text("\n")
    if case == "no templates":
        (root / "zeroshot_classification_templates.txt").unlink()
    if case == "label out of range":
        from halsift.corpus.clip_benchmark_wds import _tar_bytes

        (root / "test" / "0.tar").write_bytes(_tar_bytes([("s0000000.png", b"x"), ("s0000000.cls", b"9")]))
    code, err = _run(["--data", str(root), "--out", str(tmp_path / "o")], capsys)
    assert code == 2 and len(err.splitlines()) == 1 and re.search(message, err), err
    assert not (tmp_path / "o" / "metrics.json").exists()


def test_imagefolder_without_classnames_uses_folder_names_and_counts_must_match(tmp_path):
    from PIL import Image

    from halsift.corpus.classification import ClassificationFormatError, read_classification

    for name in ("b_dog", "a_cat"):
        (tmp_path / name).mkdir()
        Image.new("RGB", (8, 8)).save(tmp_path / name / "x.png")
    (tmp_path / "zeroshot_classification_templates.txt").write_text("a {c}\n")
    cset = read_classification(tmp_path)
    assert cset.layout == "imagefolder" and cset.classnames == ["a_cat", "b_dog"]  # sorted, as torchvision
    assert [label for _, _, label in cset.iter_items()] == [0, 1] and cset.prompts("cat") == ["a cat"]
    (tmp_path / "classnames.txt").write_text("cat\n")
    with pytest.raises(ClassificationFormatError, match=r"classnames\.txt: 1 class names for 2 class folders"):
        read_classification(tmp_path)


def test_no_weights_is_refused_unless_random_is_asked_for_by_name(tmp_path, capsys):
    """The one open_clip loader's rule holds for evaluations too: no silent, unseeded random init."""
    root = wds_fixture(tmp_path / "fix")
    code = main(["eval", "zeroshot", "--model", "halsift-tiny", "--device", "cpu", "--data", str(root),
                 "--out", str(tmp_path / "o")])
    assert code == 2 and "would score with random weights" in capsys.readouterr().err
    assert not (tmp_path / "o" / "metrics.json").exists()
    runs = [json.loads(((tmp_path / o) / "metrics.json").read_text()) for o in ("a", "b")
            if _run(["--data", str(root), "--out", str(tmp_path / o)], capsys)[0] == 0]
    assert len(runs) == 2 and runs[0] == runs[1]  # pretrained=random is seeded: the same model twice


def test_a_damaged_shard_is_read_by_the_shard_reader(tmp_path):
    """The wds layout is read by the package's one tar reader (corpus.shards.shard_parts): a shard cut short is
    one line naming it and the last whole sample, after the samples before the damage."""
    from halsift.corpus.classification import ClassificationFormatError, read_classification

    root = wds_fixture(tmp_path / "fix")
    shard = root / "test" / "0.tar"
    data = shard.read_bytes()
    shard.write_bytes(data[:len(data) // 2 + 100])  # cut inside a member
    got = []
    with pytest.raises(ClassificationFormatError, match=r"0\.tar: truncated or corrupt tar after sample s\d{7} "):
        for item in read_classification(root).iter_items():
            got.append(item)
    assert got and all(name.startswith("0.tar/s") for name, _, _ in got)
