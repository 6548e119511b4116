"""index.html, the report a person looks at: built for a tiny real run (synthetic world, oracle and random detectors
scored and selected for real, retrieval numbers made up), checked as data, then opened in headless Chromium from the
file system (skipped, with the reason, where no browser is installed); the same samples as an offline wandb Table."""

from __future__ import annotations

import json
import re
import shutil
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from halsift.launch.cli import main
from halsift.launch.cmd_run import load_recipe
from halsift.launch.stages import resolve_paths
from halsift.launch.stages.report import stage_report
from halsift.launch.stages.score import stage_score
from halsift.launch.stages.select import stage_select
from halsift.launch.stages.shared import bench_subset
from halsift.launch.stages.world import stage_world

DETECTORS = {"oracle": "oracle", "random": "random:seed=0"}


def tiny_recipe(run: Path, wandb_mode: str = "disabled"):
    r = load_recipe("quickstart", [f"run_dir={run}", "world.images=40", "world.bench_images=10",
                                   "world.retrieval_images=10", "world.pretrain_images=10", f"wandb.mode={wandb_mode}",
                                   "world.leaks=0", "world.exact_copies=0", "dedup.enabled=false"])
    r.detectors, r.score.ensembles = {}, {}  # no training: the two detectors that need none
    r.evals = type(r.evals)()  # no extra evals
    r.score.detectors = dict(DETECTORS)
    return r


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """A run folder as `halsift run` leaves it, minus the CLIP fine-tuning (its retrieval.json is made up)."""
    from halsift.eval.runs.bench_eval import evaluate_bench
    from halsift.corpus.scores import read_scores_df

    run = tmp_path_factory.mktemp("run")
    r = tiny_recipe(run)
    p = resolve_paths(r)
    stage_world(r, p)
    stage_score(r, p)
    stage_select(r, p)
    bench = bench_subset(p.bench, r.eval.bench_split, p.run)
    scores = {n: read_scores_df(p.stage("score") / n / "bench") for n in DETECTORS}
    evaluate_bench(bench, scores, p.stage("eval") / "bench", keep=r.eval.keep, n_boot=50)
    fake = {"no-tune": 20.0, "random": 30.0, "oracle": 40.0}
    retrieval = {n: [{f"synthetic/{d}/r@{k}": v + k for d in ("i2t", "t2i") for k in (1, 5, 10)}]
                 for n, v in fake.items()}
    (p.stage("eval") / "retrieval.json").write_text(json.dumps(retrieval))
    stage_report(r, p)
    return run


def page_data(html: str) -> dict:
    block = re.search(r'<script type="application/json" id="halsift-samples">(.*?)</script>', html, re.S).group(1)
    return json.loads(block.replace("<\\/", "</"))


def test_run_index_html_holds_table_plots_bench_and_samples(tiny_run):
    report = tiny_run / "report"
    html = (report / "index.html").read_text()
    # self-contained: nothing is fetched from a server
    assert not re.search(r'(src|href)="(https?:)?//', html)
    # the answer, the table with one linked row per filter, the plots inlined
    assert "Best detector filter" in html or "No detector filter" in html
    for name in ("no-tune", "random", "oracle"):
        assert f'<tr data-filter="{name}">' in html
    assert 'class="show" data-filter="oracle" data-kept="dropped"' in html
    assert 'data-filter="no-tune" data-kept' not in html  # no selection behind no-tune: no link
    pngs = re.findall(r'<img src="data:image/png;base64,[^"]+" alt="([^"]+)"', html)
    assert any(a.startswith("Dose-response") for a in pngs) and "AUROC per generator (95% bootstrap CI)" in pngs
    assert "Sentence-level AUROC per generator, 95% bootstrap CI" in html and "hallucination type" in html
    assert "Mean score by sentence position" in html

    data = page_data(html)
    assert data["detectors"] == ["oracle", "random"] and [f["name"] for f in data["filters"]] == ["oracle", "random"]
    assert data["sets"] == ["corpus", "bench"] and data["totals"]["corpus"] == 40
    corpus = [s for s in data["samples"] if s["s"] == 0]
    bench = [s for s in data["samples"] if s["s"] == 1]
    assert len(corpus) == 40 and bench and len({data["generators"][s["g"]] for s in bench}) >= 6
    for s in data["samples"]:
        assert (report / s["i"]).exists()
    sents = [t for s in corpus for t in s["t"]]
    assert {t[1] for t in sents} >= {"c", "i"}  # the synthetic corpus knows its labels
    # oracle scores are the labels, and its selection kept no hallucinated sentence of the corpus
    assert all(t[2][0] == (100 if t[1] == "c" else 0) for t in sents if t[1] in ("c", "i"))
    kept_by_oracle = [t for t in sents if t[3] & 1]
    assert kept_by_oracle and all(t[1] == "c" for t in kept_by_oracle)
    # kept bits are the selection's kept.parquet (whole captions: sentence_index -1 marks every sentence)
    kept = pq.read_table(tiny_run / "select" / "random" / "kept.parquet").to_pydict()
    whole = {k for k, i in zip(kept["key"], kept["sentence_index"]) if i == -1}
    assert whole and len(whole) == len(kept["key"])  # the quickstart keeps whole captions
    want = {(s["k"], i) for s in corpus if s["k"] in whole for i in range(len(s["t"]))}
    got = {(s["k"], i) for s in corpus for i, t in enumerate(s["t"]) if t[3] & 2}
    assert got == want
    # on the bench a filter keeps its detector's top eval.keep share
    bench_sents = [t for s in bench for t in s["t"] if t[2][1] is not None]
    share = sum(1 for t in bench_sents if t[3] & 2) / len(bench_sents)
    assert 0.15 <= share <= 0.25


def test_without_a_selection_a_filter_keeps_its_detectors_top_share(tiny_run):
    from halsift.eval.report.html import collect_samples

    s = collect_samples(list(DETECTORS), corpus=tiny_run / "world" / "corpus", keep=0.5, max_samples=30,
                        corpus_scores={n: tiny_run / "score" / n / "corpus" for n in DETECTORS})
    assert [f["name"] for f in s.filters] == list(DETECTORS) and len(s.samples) == 30 and s.totals["corpus"] == 40
    sents = [t for smp in s.samples for t in smp["t"]]
    cut = sorted((t[2][1] for t in sents), reverse=True)[round(len(sents) / 2) - 1]
    assert all(bool(t[3] & 2) == (t[2][1] >= cut) for t in sents)
    assert 0.45 <= sum(1 for t in sents if t[3] & 2) / len(sents) <= 0.6


def test_eval_bench_writes_index_html_and_counts_bad_images(tiny_run, tmp_path, capsys):
    bench = Path(bench_subset(str(tiny_run / "world" / "bench" / "bench.jsonl"), "test", tiny_run))
    rows = [json.loads(x) for x in bench.read_text().splitlines()]
    broken = Path(rows[0]["image"])
    copy = tmp_path / "bench.jsonl"  # the same bench with one image replaced by garbage bytes
    (tmp_path / "bad.png").write_bytes(b"not an image")
    rows = [{**row, "image": "bad.png"} if row["image"] == str(broken) else row for row in rows]
    copy.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "image_roots.json").write_bytes((bench.parent / "image_roots.json").read_bytes())  # its images' folder
    scores = [str(tiny_run / "score" / n / "bench") for n in DETECTORS]
    out = tmp_path / "eval"
    assert main(["eval", "bench", "--bench", str(copy), "--scores", *scores, "--out", str(out), "--n-boot", "20",
                 "--no-plots"]) == 0
    assert "index.html" in capsys.readouterr().out
    html = (out / "index.html").read_text()
    assert "Best detector on the bench: <code>oracle</code>" in html
    data = page_data(html)
    assert data["sets"] == ["bench"] and [f["name"] for f in data["filters"]] == ["oracle", "random:seed=0"]
    assert sum(1 for s in data["samples"] if not s["i"]) >= 1  # captions of the broken image: no thumbnail
    assert re.search(r"Skipped: \d+ × image not_image", html)
    assert main(["eval", "bench", "--bench", str(copy), "--scores", *scores, "--out", str(tmp_path / "plain"),
                 "--n-boot", "20", "--no-plots", "--no-html"]) == 0
    assert not (tmp_path / "plain" / "index.html").exists() and (tmp_path / "plain" / "report.md").exists()


def test_select_html_marks_what_the_selection_kept(tiny_run, tmp_path, capsys):
    out = tmp_path / "sel"
    assert main(["select", "--scores", str(tiny_run / "score" / "random" / "corpus"), "--data",
                 str(tiny_run / "world" / "corpus"), "--out", str(out), "--keep", "0.3", "--html",
                 "--no-progress"]) == 0
    assert f"wrote {out / 'index.html'}" in capsys.readouterr().out
    html = (out / "index.html").read_text()
    manifest = json.loads((out / "manifest.json").read_text())
    assert f"kept {manifest['kept_units']} of {manifest['candidates']} units" in html
    data = page_data(html)
    assert data["sets"] == ["corpus"] and len(data["filters"]) == 1 and len(data["samples"]) == 40
    kept = pq.read_table(out / "kept.parquet").to_pydict()
    got = {(smp["k"], i) for smp in data["samples"] for i, t in enumerate(smp["t"]) if t[3] & 1}
    assert got == set(zip(kept["key"], kept["sentence_index"])) and len(got) == manifest["kept_units"]


def test_offline_wandb_run_holds_the_samples_table(tiny_run, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run, ignore=shutil.ignore_patterns("report"))
    r = tiny_recipe(run, wandb_mode="offline")
    stage_report(r, resolve_paths(r))
    tables = list((run / "report" / "wandb").glob("offline-run-*/files/media/table/samples_*.table.json"))
    assert len(tables) == 1
    table = json.loads(tables[0].read_text())
    assert table["columns"][:6] == ["image", "set", "generator", "key", "sentences", "labels"]
    assert "oracle/min" in table["columns"] and "kept/random" in table["columns"]
    data = page_data((run / "report" / "index.html").read_text())
    assert len(table["data"]) == len(data["samples"])
    assert [row[3] for row in table["data"]] == [smp["k"] for smp in data["samples"]]
    # the Table with its images is a run artifact, staged beside the offline run for `wandb sync`
    staged = [f for f in (run / "report" / "wandb" / "data" / "artifacts" / "staging").iterdir() if f.is_file()]
    full = [json.loads(f.read_bytes()) for f in staged if f.read_bytes()[:1] == b"{"]
    full = [t for t in full if t.get("columns", [])[:1] == ["image"]]
    assert full and all(len(t["data"]) == len(data["samples"]) for t in full)  # (wandb may stage it twice)
    assert full[0]["data"][0][0]["_type"] == "image-file"
    images = [f for f in staged if f.read_bytes()[:4] in (b"\x89PNG", b"\xff\xd8\xff\xe0")]
    assert len(images) >= len(data["samples"]) // 2


# ------------------------------------------------------------------------------------------------ in a browser
def chromium():
    """A headless Chromium driven by selenium through Debian's chromedriver; skips, saying why, without one."""
    chrome = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chrome and driver):
        pytest.skip("no browser: install Debian's chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver) to run the report in a real browser")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = chrome
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,1100", "--disable-background-networking"):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=opts)


def load(driver, path: Path) -> tuple[float, float]:
    """Open a file and return (load event, first page of samples rendered) in ms since navigation start."""
    driver.get(path.resolve().as_uri())
    nav = driver.execute_script("return performance.getEntriesByType('navigation')[0].loadEventEnd")
    return float(nav), float(driver.execute_script("return window.halsiftRenderedMs || -1"))


def count(driver) -> int:
    return int(driver.find_element("id", "count").get_attribute("data-total"))


def test_report_renders_and_filters_in_chromium(tiny_run, tmp_path):
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select, WebDriverWait

    driver = chromium()
    try:
        loaded, rendered = load(driver, tiny_run / "report" / "index.html")
        print(f"\ntiny run report: load event {loaded:.0f} ms, first page of samples {rendered:.0f} ms")
        rows = driver.find_elements("css selector", "#compare-table tbody tr")
        assert [r.get_attribute("data-filter") for r in rows] == ["no-tune", "oracle", "random"]
        imgs = driver.find_elements("css selector", "#plots img")
        assert len(imgs) >= 4 and all(driver.execute_script("return arguments[0].naturalWidth", i) > 100 for i in imgs)
        cards = driver.find_elements("css selector", "#grid .card")
        total = count(driver)
        assert total == len(page_data(driver.page_source)["samples"]) and len(cards) == min(24, total)
        thumb = cards[0].find_element("tag name", "img")
        WebDriverWait(driver, 10).until(lambda d: d.execute_script(
            "return arguments[0].complete && arguments[0].naturalWidth > 0", thumb))
        assert thumb.get_attribute("alt")  # alt text: the caption
        assert "kept" in cards[0].text or "dropped" in cards[0].text
        driver.save_screenshot(str(tmp_path / "report_top.png"))
        first = cards[0].find_element("css selector", ".meta").text
        driver.find_element("id", "next2").click()  # paging, from the pager under the grid
        assert "page 2 of" in driver.find_element("id", "count").text
        assert driver.find_element("css selector", "#grid .card .meta").text != first
        driver.find_element("id", "prev").click()
        assert driver.find_element("css selector", "#grid .card .meta").text == first

        Select(driver.find_element("id", "f-label")).select_by_value("i")
        with_hallucination = count(driver)
        assert 0 < with_hallucination < total
        # keyboard: tab to the oracle row's "dropped" link and press Enter -> the browser shows what it dropped
        link = driver.find_element("css selector", 'a.show[data-filter="oracle"][data-kept="dropped"]')
        driver.execute_script("arguments[0].focus()", link)
        link.send_keys(Keys.ENTER)
        assert Select(driver.find_element("id", "f-filter")).first_selected_option.text.startswith("oracle,")
        assert Select(driver.find_element("id", "f-kept")).first_selected_option.get_attribute("value") == "dropped"
        dropped = count(driver)
        assert 0 < dropped <= with_hallucination
        Select(driver.find_element("id", "f-view")).select_by_value("fa")
        assert count(driver) == 0  # the oracle keeps no hallucinated sentence: no false accepts
        assert "No sample matches" in driver.find_element("id", "grid").text
        Select(driver.find_element("id", "f-filter")).select_by_index(1)
        Select(driver.find_element("id", "f-kept")).select_by_value("")
        assert count(driver) > 0  # random keeps hallucinated sentences
        first = driver.find_element("css selector", "#grid .card li.focus")
        assert "hallucinated" in first.text and "kept" in first.text
        driver.execute_script("document.getElementById('browser').scrollIntoView()")
        driver.save_screenshot(str(tmp_path / "report_samples.png"))
        print(f"screenshots: {tmp_path / 'report_top.png'}, {tmp_path / 'report_samples.png'}")
    finally:
        driver.quit()


def test_two_thousand_image_page_stays_responsive(tmp_path):
    """A page with 2,000 images x 5 sentences x 8 detectors: load time and one filter change, measured and printed."""
    import numpy as np

    from halsift.eval.report.html import SampleSet, render_html

    rng = np.random.default_rng(0)
    dets = [f"det{i}" for i in range(8)]
    samples = [{"k": f"k{n:05d}", "s": 0, "g": n % 6, "i": "", "t": [
        [f"A {['red', 'blue'][j % 2]} square number {j} of sample {n}.", "ci"[int(rng.random() < 0.3)],
         [int(v) for v in rng.integers(0, 101, 8)], int(rng.integers(0, 256)), []] for j in range(5)]}
        for n in range(2000)]
    s = SampleSet(detectors=dets, filters=[{"name": d, "detector": i, "keep": 0.2} for i, d in enumerate(dets)],
                  generators=[f"gen{i}" for i in range(6)], sets=["corpus"], samples=samples,
                  totals={"corpus": 2000})
    path = render_html(tmp_path, "2k", samples=s)
    driver = chromium()
    try:
        loaded, rendered = load(driver, path)
        assert count(driver) == 2000
        t0 = time.perf_counter()
        from selenium.webdriver.support.ui import Select

        Select(driver.find_element("id", "f-view")).select_by_value("fa")
        fa = count(driver)
        ms = 1000 * (time.perf_counter() - t0)
        print(f"\n2,000-image page ({path.stat().st_size / 1e6:.1f} MB): load event {loaded:.0f} ms, first page "
              f"{rendered:.0f} ms; worst-false-accepts view over 10,000 sentences {ms:.0f} ms ({fa} samples)")
        assert 0 < fa < 2000
    finally:
        driver.quit()
