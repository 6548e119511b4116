"""Issue 35 (risk): a bench row's ``image`` stays inside the bench file's folder or a folder its
``image_roots.json`` lists; a bench from elsewhere cannot make halsift read any file on the disk."""

from __future__ import annotations

import json
import shutil

import pytest
from filtering_data import make_bench

from halsift.corpus.bench import BenchFormatError, read_bench
from halsift.launch.cli import main


def _point(bench, image: str) -> None:
    """Rewrite the bench's first row to use ``image``."""
    lines = bench.read_text().splitlines()
    row = json.loads(lines[0])
    row["image"] = image
    bench.write_text("\n".join([json.dumps(row)] + lines[1:]) + "\n")


@pytest.fixture
def outside(tmp_path):
    """A bench whose first row names a real image outside its folder (``../private/photo.png``)."""
    bench = make_bench(tmp_path / "bench", captions=3)
    (tmp_path / "private").mkdir()
    shutil.copy(bench.parent / "images" / "im0.png", tmp_path / "private" / "photo.png")
    return bench


def test_parent_path_is_refused_naming_line_and_field(outside, tmp_path, capsys):
    """Before: `halsift score` read ../private/photo.png and scored it (exit 0)."""
    _point(outside, "../private/photo.png")
    with pytest.raises(BenchFormatError, match=r"bench.jsonl:1: field 'image' '../private/photo.png' is outside the "
                                               r"bench folder .*image_roots.json"):
        read_bench(outside)
    assert main(["score", "--detector", "random:seed=0", "--data", str(outside), "--out", str(tmp_path / "s"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "field 'image'" in err and "outside the bench folder" in err


@pytest.mark.parametrize("image", ["{abs}", "images/../../private/photo.png"])
def test_absolute_and_dotted_paths_are_refused(outside, tmp_path, image):
    """Variants: an absolute path, and a ``..`` hidden behind a folder that exists."""
    _point(outside, image.format(abs=tmp_path / "private" / "photo.png"))
    with pytest.raises(BenchFormatError, match="outside the bench folder"):
        read_bench(outside)


def test_a_folder_listed_in_image_roots_is_allowed(outside, tmp_path):
    from halsift.corpus.bench import write_image_roots

    _point(outside, str(tmp_path / "private" / "photo.png"))
    write_image_roots(outside, [tmp_path / "private"])
    assert json.loads((outside.parent / "image_roots.json").read_text()) == [str(tmp_path / "private")]
    rows = read_bench(outside)
    assert rows[0].image == str(tmp_path / "private" / "photo.png")
    _point(outside, "../elsewhere/x.png")  # another folder is still refused, and the message says what is listed
    with pytest.raises(BenchFormatError, match="and the folders its image_roots.json lists"):
        read_bench(outside)


def test_a_malformed_image_roots_file_is_one_line(outside):
    (outside.parent / "image_roots.json").write_text('{"roots": 1}')
    with pytest.raises(BenchFormatError, match=r"image_roots.json: expected a JSON list of folder paths"):
        read_bench(outside)


def test_convert_alignbench_with_images_elsewhere_keeps_working(tmp_path):
    """`convert alignbench --images DIR` writes ``../`` paths into DIR: it records DIR, and the bench scores."""
    from test_alignbench import _df

    from halsift.corpus.alignbench import convert_alignbench

    images = tmp_path / "mirror"
    for model, name in {(r[0], r[2]) for r in _df().itertuples(index=False)}:
        (images / model).mkdir(parents=True, exist_ok=True)
        shutil.copy(make_bench(tmp_path / "b", captions=1).parent / "images" / "im0.png", images / model / name)
    src = tmp_path / "alignbench.csv"
    _df().to_csv(src, index=False)
    out = tmp_path / "bench" / "bench.jsonl"
    convert_alignbench(src, out, images_dir=images, image_template="{model}/{image_name}")
    assert json.loads((out.parent / "image_roots.json").read_text()) == [str(images)]
    rows = read_bench(out)
    assert rows[0].image.startswith("../mirror/")
    assert main(["score", "--detector", "random:seed=0", "--data", str(out), "--out", str(tmp_path / "s"),
                 "--no-progress"]) == 0
    assert json.loads((tmp_path / "s" / "_manifest.json").read_text())["sentences"] == len(rows)


def test_recipe_bench_split_points_at_the_original_folder(tmp_path):
    """The recipe's bench split (absolute paths into the user's bench folder) is readable and scores."""
    from halsift.launch.stages.shared import bench_subset

    bench = make_bench(tmp_path / "bench", captions=4)
    subset = bench_subset(str(bench), "test", tmp_path / "run")
    rows = read_bench(subset)
    assert rows and all(r.image.startswith(str(tmp_path / "bench")) for r in rows)
    assert json.loads((tmp_path / "run" / "bench_test" / "image_roots.json").read_text()) == [str(tmp_path / "bench")]
    assert main(["score", "--detector", "random:seed=0", "--data", subset, "--out", str(tmp_path / "s"),
                 "--no-progress"]) == 0
