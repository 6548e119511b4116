"""Hostile text in halsift's pages: captions, keys and names that try to end or comment out the sample browser's
data block (``</script>``, ``<!--<script>``, ...) or to inject markup. The data block holds no ``<``, ``>`` or ``&``
and parses back to the same data; elsewhere every text is HTML-escaped; in headless Chromium the browser renders the
hostile captions as text (skipped without a browser, as in test_html_report)."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from test_html_report import chromium, count

from halsift.corpus.shards import Sample, ShardWriter
from halsift.eval.report.html import SampleSet, render_html
from halsift.launch.cli import main

HOSTILE = [
    "</script>",
    "<!--<script>",
    "</SCRIPT >",
    "]]>",
    "line\u2028separator and paragraph\u2029separator",
    "&lt; is a literal entity, &amp; too",
    "<script>window.pwned = 1</script>",
    "<img src=x onerror=\"window.pwned = 2\">",
    "--> <!-- <![CDATA[ x ]]> </scr</script>ipt>",
    "a \\u003c backslash escape written out, and a \"quote\" and a 'single'",
    "\u2603 snowman, \U0001f600 emoji, \t tab",
]
NAME = "<b id=\"injected\">det</b>"  # a detector / generator / set name with markup
# the corpus for the pages: without "-->", which would close the comment that "<!--<script>" opens and hide the break
CAPTIONS = [t for t in HOSTILE if "-->" not in t]


def data_block(html: str) -> str:
    """The text of the page's data block, up to the first ``</script`` (what an HTML parser would end it at)."""
    start = html.index('<script type="application/json" id="halsift-samples">')
    start = html.index(">", start) + 1
    return html[start:html.lower().index("</script", start)]


def hostile_set(texts: list[str]) -> SampleSet:
    samples = [{"k": t, "s": 0, "g": 0, "i": "", "t": [[t, "i", [50], 1, [t]]]} for t in texts]
    return SampleSet(detectors=[NAME], filters=[{"name": NAME, "detector": 0, "keep": 0.5, "how": "<i>x</i>"}],
                     generators=[NAME], sets=["<corpus>"], samples=samples, totals={"<corpus>": len(samples)})


@pytest.mark.parametrize("text", HOSTILE)
def test_data_block_holds_no_markup_characters_and_round_trips(tmp_path, text):
    s = hostile_set([text, f"before {text} after"])
    html = render_html(tmp_path, "t", samples=s).read_text(encoding="utf-8")
    block = data_block(html)
    assert not set(block) & set("<>&\u2028\u2029"), block
    data = json.loads(block)
    assert [smp["t"][0][0] for smp in data["samples"]] == [text, f"before {text} after"]
    assert [smp["k"] for smp in data["samples"]] == [text, f"before {text} after"]
    assert data["detectors"] == data["generators"] == [NAME] and data["filters"][0]["how"] == "<i>x</i>"


def test_names_outside_the_data_block_are_html_escaped(tmp_path):
    html = render_html(tmp_path, "<title>run</title>", samples=hostile_set(HOSTILE)).read_text(encoding="utf-8")
    assert '<b id="injected">' not in html and "&lt;b id=&#34;injected&#34;&gt;det&lt;/b&gt;" in html
    assert "<title>halsift report: &lt;title&gt;run&lt;/title&gt;</title>" in html
    assert "window.pwned" not in html.replace(data_block(html), "")  # hostile captions only in the data block
    assert len(re.findall(r"<script\b", html)) == 2 and len(re.findall(r"</script>", html)) == 2


def test_a_lone_surrogate_in_a_caption_does_not_stop_the_page(tmp_path):
    """A bench's JSON may hold ``"\\ud800"`` (a lone surrogate, which has no UTF-8 encoding): escaped in the data
    block, replaced by '?' in the page's text; the page is written."""
    text = json.loads('"broken \\ud800 surrogate"')
    s = hostile_set([text])
    s.generators = [text]
    html = render_html(tmp_path, "t", samples=s).read_text(encoding="utf-8")
    assert json.loads(data_block(html))["samples"][0]["t"][0][0] == text
    assert "broken ? surrogate" in html  # the generator's <option>


def _png() -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def hostile_corpus(tmp_path_factory) -> tuple[Path, Path]:
    """A corpus whose captions (one sentence each) and captioner names are the hostile strings, and its scores."""
    root = tmp_path_factory.mktemp("hostile")
    with ShardWriter(root / "corpus", maxcount=100) as w:
        for i, text in enumerate(CAPTIONS):
            sents = [{"text": text, "position": 0, "label": "correct", "types": [], "spans": []}]
            w.write(Sample(f"h{i:03d}", _png(), text, ext="png",
                           meta={"captioner": CAPTIONS[(i + 1) % len(CAPTIONS)], "source": "i2t", "sentences": sents}))
    assert main(["score", "--detector", "random:seed=0", "--data", str(root / "corpus"), "--out",
                 str(root / "scores"), "--no-progress"]) == 0
    return root / "corpus", root / "scores"


def test_select_html_of_hostile_captions_parses(hostile_corpus, tmp_path):
    corpus, scores = hostile_corpus
    assert main(["select", "--scores", str(scores), "--data", str(corpus), "--out", str(tmp_path / "sel"),
                 "--keep", "0.5", "--html", "--no-progress"]) == 0
    html = (tmp_path / "sel" / "index.html").read_text(encoding="utf-8")
    data = json.loads(data_block(html))
    assert [smp["t"][0][0] for smp in data["samples"]] == CAPTIONS
    assert sorted(data["generators"]) == sorted(CAPTIONS)


def test_browser_renders_hostile_captions_as_text(hostile_corpus, tmp_path):
    """``select --html`` of the hostile corpus in headless Chromium: the data block parses, every caption is shown
    as the text it is (no element injected, no script run), and the generator menu lists the names as text."""
    from selenium.webdriver.support.ui import Select

    corpus, scores = hostile_corpus
    assert main(["select", "--scores", str(scores), "--data", str(corpus), "--out", str(tmp_path / "sel"),
                 "--keep", "0.5", "--html", "--no-progress"]) == 0
    driver = chromium()
    try:
        driver.get((tmp_path / "sel" / "index.html").resolve().as_uri())
        assert driver.execute_script("return window.halsiftRenderedMs || -1") > 0  # the browser's script ran
        assert count(driver) == len(CAPTIONS)
        shown = [e.get_attribute("textContent") for e in driver.find_elements("css selector", "#grid .card li .txt")]
        assert sorted(shown) == sorted(CAPTIONS)
        assert driver.execute_script("return window.pwned === undefined")
        assert not driver.find_elements("css selector", "#grid img:not([src$='.jpg']), #grid script, #injected")
        gens = [o.get_attribute("textContent") for o in Select(driver.find_element("id", "f-gen")).options[1:]]
        assert sorted(gens) == sorted(CAPTIONS)
        Select(driver.find_element("id", "f-gen")).select_by_index(gens.index("<!--<script>") + 1)
        assert count(driver) == 1
    finally:
        driver.quit()
