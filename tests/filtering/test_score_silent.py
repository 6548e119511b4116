"""Issue 35: nothing silently wrong on the scoring side. A non-finite score is never written, too many parse failures
stop the run, random weights only when asked for by name, and a run that scored nothing is exit 2; each with one
line."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from loopback import LoopbackServer
from filtering_data import make_bench, make_corpus

from halsift.filtering.detectors.base import Detector, Item, Result
from halsift.filtering.scoring.runner import score, score_bench
from halsift.filtering.scoring.guard import MIN_CHECKED, ScoreError
from halsift.filtering.detectors.spec import load_detector
from halsift.launch.cli import main


def _score(data, out, spec: str, *extra: str) -> int:
    return main(["score", "--detector", spec, "--data", str(data), "--out", str(out), "--no-progress", *extra])


def _err_line(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    return err[0]


class Scripted(Detector):
    """Scores 70 (parsed) except where ``verdict(n, item)`` (n = 1, 2, ... over all items) says otherwise."""

    family = "scripted"
    needs_image = False

    def __init__(self, verdict) -> None:
        super().__init__("scripted")
        self.verdict, self.n = verdict, 0

    def score_batch(self, items: Sequence[Item]) -> list[Result]:
        out = []
        for it in items:
            self.n += 1
            out.append(self.verdict(self.n, it) or Result(70.0))
        return out


# ------------------------------------------------------------------------------------------ non-finite scores
@pytest.fixture
def nan_checkpoint(tmp_path):
    import open_clip
    import torch

    from halsift.filtering.models.clip_models import register_builtin_configs
    from halsift.training.engine import save_state_dict_safetensors

    register_builtin_configs()
    model = open_clip.create_model("halsift-tiny")
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    path = tmp_path / "nan.safetensors"
    save_state_dict_safetensors(model, path)
    return path


@pytest.mark.parametrize("workers", [[], ["--decode-workers", "1"]], ids=["thread", "workers"])
def test_nan_weights_stop_the_run_and_write_no_score(tmp_path, capsys, nan_checkpoint, workers):
    """Before: every sentence scored 0.0 with parsed=True, exit 0. Variant: the decode-worker path."""
    data = make_corpus(tmp_path / "c", shards=2, per_shard=3)
    out = tmp_path / "s"
    assert _score(data, out, f"clip:arch=halsift-tiny,checkpoint={nan_checkpoint}", *workers) == 2
    line = _err_line(capsys)
    assert "non-finite score nan" in line and "nothing of this part was written" in line
    assert not list(out.glob("part-*.parquet"))
    m = json.loads((out / "_manifest.json").read_text())
    assert m["status"] == "failed" and "non-finite score nan" in m["error"]  # select refuses it, and says why


def test_an_infinite_score_is_never_written(tmp_path):
    """Variant: +inf from a detector (it was clipped to 100) in the last shard: the parts before it are kept."""
    data = make_corpus(tmp_path / "c", shards=3, per_shard=2)
    det = Scripted(lambda n, it: Result(float("inf")) if it.key == "s0_00005" else None)
    with pytest.raises(ScoreError, match=r"detector scripted: non-finite score inf for key 's0_00005'"):
        score(det, data, tmp_path / "s", batch_size=1, show_progress=False)
    assert len(list((tmp_path / "s").glob("part-*.parquet"))) == 2


# ------------------------------------------------------------------------------------------ parse failures
@pytest.fixture
def never_parses():
    """A loopback chat-completions server whose every reply has no score in it, and the api spec that asks it."""
    srv = LoopbackServer(content="I cannot tell from this picture.")
    srv.spec = f"api:base_url={srv.url}/v1,model=judge,mode=prompt,backoff=0.01,concurrency=2"
    yield srv
    srv.close()


def test_a_server_whose_replies_never_parse_stops_the_run(tmp_path, capsys, never_parses):
    """Before: every sentence got 50, exit 0, and select went on. Now exit 2, the folder is 'failed', select
    refuses it; with --max-parse-failures 1 the same folder completes without asking the server again."""
    data = make_corpus(tmp_path / "c", shards=1, per_shard=3)
    out = tmp_path / "s"
    assert _score(data, out, never_parses.spec) == 2
    line = _err_line(capsys)
    assert "got no parsable answer (max_parse_failures 0.2)" in line and "in the folder" in line
    m = json.loads((out / "_manifest.json").read_text())
    assert m["status"] == "failed" and m["parse_failures"] == m["sentences"] > 0 and "parsable" in m["error"]
    assert main(["select", "--scores", str(out), "--data", str(data), "--out", str(tmp_path / "sel"), "--keep",
                 "0.5", "--no-progress"]) == 2
    line = _err_line(capsys)
    assert "status 'failed' (detector api:" in line and "got no parsable answer" in line
    assert _score(data, out, never_parses.spec, "--max-parse-failures", "1") == 0  # configurable; parts reused
    m = json.loads((out / "_manifest.json").read_text())
    assert m["status"] == "complete" and m["sentences_scored_this_run"] == 0 and "error" not in m


def test_the_rate_stops_a_run_midway_once_enough_items_were_scored(tmp_path):
    """Variant: half the answers unparsable, checked as results come (after MIN_CHECKED items): the run stops in its
    first part, so nothing is written and no time is spent on the rest."""
    data = make_corpus(tmp_path / "c", shards=2, per_shard=120)
    det = Scripted(lambda n, it: Result(50.0, parsed=False) if n % 2 else None)
    with pytest.raises(ScoreError, match=r"items \(5\d.\d%\) scored so far got no parsable answer"):
        score(det, data, tmp_path / "s", batch_size=16, show_progress=False)
    assert det.n < 2 * MIN_CHECKED and not list((tmp_path / "s").glob("part-*.parquet"))


def test_one_early_failure_does_not_stop_a_run(tmp_path):
    """Variant: the first answer fails (a rate of 100% so far): below MIN_CHECKED items only the end decides."""
    data = make_corpus(tmp_path / "c", shards=1, per_shard=8)
    det = Scripted(lambda n, it: Result(50.0, parsed=False) if n == 1 else None)
    score(det, data, tmp_path / "s", batch_size=1, show_progress=False)
    m = json.loads((tmp_path / "s" / "_manifest.json").read_text())
    assert m["status"] == "complete" and m["parse_failures"] == 1 < m["sentences"]


def test_max_parse_failures_is_checked_as_a_flag(tmp_path, capsys):
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    assert _score(data, tmp_path / "s", "random:seed=0", "--max-parse-failures", "1.5") == 2
    assert "--max-parse-failures: expected a value in [0, 1], got 1.5" in _err_line(capsys)
    assert not (tmp_path / "s").exists()


# ------------------------------------------------------------------------------------------ nothing to score
def test_nothing_scoreable_is_exit_2_with_the_skips_by_reason(tmp_path, capsys):
    """Before: 'scored 0 items', exit 0."""
    keys = {f"s0_{i:05d}": "image" for i in range(3)} | {"s0_00003": "caption"}
    data = make_corpus(tmp_path / "c", shards=1, per_shard=4, corrupt=keys)
    assert _score(data, tmp_path / "s", "random:seed=0") == 2
    line = _err_line(capsys)
    assert "nothing to score: 4 sample(s) skipped (" in line
    assert "(not_image=3, empty_caption=1); e.g. s0_00000: not an image" in line
    assert json.loads((tmp_path / "s" / "_manifest.json").read_text())["status"] == "failed"


def test_a_bench_whose_images_are_all_missing_is_an_error(tmp_path):
    """Variant: a bench (score_bench, eval bench) whose every image is gone."""
    bench = make_bench(tmp_path / "b", captions=3)
    for p in (bench.parent / "images").iterdir():
        p.unlink()
    with pytest.raises(ScoreError, match=r"nothing to score: \d+ sample\(s\) skipped \(missing_image=\d+\)"):
        score_bench("random:seed=0", bench, tmp_path / "s", show_progress=False)


# ------------------------------------------------------------------------------------------ random weights
def test_clip_without_weights_is_refused_naming_the_spec(tmp_path, capsys):
    """Before: a whole corpus scored on random weights, with only open_clip's warning."""
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    assert _score(data, tmp_path / "s", "clip:arch=halsift-tiny") == 2
    line = _err_line(capsys)
    assert "'clip:arch=halsift-tiny'" in line and "no pretrained= or checkpoint= given" in line
    assert "pretrained=random" in line and not list((tmp_path / "s").glob("part-*"))
    assert _score(data, tmp_path / "s", "clip:arch=halsift-tiny,pretrained=random") == 0  # asked for by name


@pytest.mark.parametrize("spec", ["ensemble:members=[clip:arch=halsift-tiny;random:seed=1]",
                                  {"family": "clip", "arch": "halsift-tiny", "seed": 3}])
def test_random_weights_are_refused_in_every_form(spec):
    """Variants: an ensemble member, a spec mapping (a YAML spec file's content)."""
    with pytest.raises(ValueError, match="no pretrained= or checkpoint= given"):
        load_detector(spec)


def test_a_lora_base_without_weights_is_refused(tmp_path):
    """Variant: the base in an adapter folder's detector.yaml (its CLIP is built before the adapter is read)."""
    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / "detector.yaml").write_text("kind: clip\nbase: clip:arch=halsift-tiny\nadapter: true\n")
    with pytest.raises(ValueError, match="arch='halsift-tiny': no pretrained= or checkpoint= given"):
        load_detector(f"lora:{tmp_path / 'adapter'}")


def test_a_vlm_checkpoint_missing_weights_is_refused(tmp_path):
    """Variant: transformers would initialise the missing tensors at random (a warning, then exit 0)."""
    import safetensors.torch as st

    from halsift.synth.tiny_vlm import build_tiny_vlm

    folder = build_tiny_vlm("llava", tmp_path / "vlm")
    weights = next(folder.glob("*.safetensors"))
    state = st.load_file(weights)
    dropped = sorted(state)[-1]
    del state[dropped]
    st.save_file(state, weights, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"1 weight\(s\) are not in its checkpoint .* randomly initialised"):
        load_detector(f"vlm:model={folder}")


@pytest.mark.parametrize("override, needles", [
    ("score.detectors.c=clip:arch={arch}", ("score.detectors.c", "no pretrained= or checkpoint= given")),
    ("score.detectors.e=ensemble:members=[random:seed=1;clip:arch={arch}]", ("score.detectors.e", "pretrained=random")),
    ("score.max_parse_failures=1.5", ("score.max_parse_failures", "expected a value in [0, 1], got 1.5")),
])
def test_a_recipe_dry_run_refuses_them_before_any_stage_runs(override, needles, capsys):
    """Variants: the recipe path (`halsift run --dry-run`), before hours of world/pretrain stages."""
    assert main(["run", "quickstart", override, "--dry-run"]) == 2
    line = _err_line(capsys)
    assert all(n in line for n in needles), line
