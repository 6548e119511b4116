"""The HTML report: one ``index.html`` per run (or bench evaluation) that opens from the file system, rendered with
Jinja2 — the compare-filters table and its answer, the plots (inlined as data URIs), per-generator AUROC with CIs,
hallucination types, position curves, and a paged **sample browser**: every image with its caption, each sentence
coloured by each detector's score and marked with its label where known, filtered by detector / generator /
kept-dropped / label, with sorted views of the worst false accepts and false rejects.

Samples travel as one compact JSON block (:class:`SampleSet`); their thumbnails are JPEG files in ``samples/``
beside ``index.html`` (only the shown page loads them), so a 2,000-image run stays light. The same samples can be
logged as a ``wandb.Table`` (:func:`log_samples_table`).
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import math
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from halsift.corpus.atomic import naming_errors, write_text_atomic
from halsift.corpus.safe_paths import remove_tree

SAMPLES_DIR = "samples"  # thumbnails beside index.html
THUMB_PX = 160  # longest side of a thumbnail
MAX_SAMPLES = 2000  # images per set shown in the browser (the first ones in shard / bench order)
LABELS = {"correct": "c", "incorrect": "i", "unknown": "u"}
# inside JSON strings: what an HTML parser reads in a <script> element (<, >, & of </script>, <!--, ]]>), the line
# separators older JavaScript parsers end a string at, and lone surrogates (no UTF-8 encoding exists for them)
_SCRIPT_UNSAFE = re.compile("[<>&\u2028\u2029\ud800-\udfff]")


def script_json(data: object) -> str:
    """``data`` as JSON that is safe as the whole text of a ``<script>`` element: every ``<``, ``>``, ``&``,
    U+2028/U+2029 and lone surrogate is written as its ``\\uXXXX`` escape, so no caption, key or name can end
    the element (``</script>``) or open a comment (``<!--``); ``JSON.parse`` and ``json.loads`` read the same
    data back. The one serializer of data embedded in halsift's pages (also their templates' ``tojson``)."""
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    return _SCRIPT_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


@dataclass
class SampleSet:
    """Samples for the browser, in the compact form the page reads.

    ``samples``: ``{"k": key, "s": set index, "g": generator index, "i": thumbnail path or "", "t": sentences}``,
    each sentence ``[text, label ("c"|"i"|"u"|None), scores (one per detector, int 0–100 or None),
    kept bits (bit j: kept by filters[j]), types]``. ``filters``: ``{"name", "detector" (index), "keep", "how"}``.
    """

    detectors: list[str] = field(default_factory=list)
    filters: list[dict] = field(default_factory=list)
    generators: list[str] = field(default_factory=list)
    sets: list[str] = field(default_factory=list)
    samples: list[dict] = field(default_factory=list)
    totals: dict[str, int] = field(default_factory=dict)  # set -> images before the MAX_SAMPLES cap
    skipped: dict[str, int] = field(default_factory=dict)  # why -> count (undecodable images, ...)
    thumbs: dict[str, bytes] = field(default_factory=dict)  # relative path -> JPEG bytes

    def to_json(self) -> str:
        """The page's data block (:func:`script_json`)."""
        return script_json({"detectors": self.detectors, "filters": self.filters, "generators": self.generators,
                            "sets": self.sets, "samples": self.samples, "totals": self.totals})


def thumbnail(data: bytes, key: str = "") -> bytes:
    """A JPEG thumbnail (longest side :data:`THUMB_PX`) of image bytes; raises ImageDecodeError on a bad image."""
    from halsift.corpus.images import decode_image

    img = decode_image(data, key)
    img.thumbnail((THUMB_PX, THUMB_PX))
    buf = io.BytesIO()
    img.save(buf, format="JPEG", quality=85)
    return buf.getvalue()


def _score_map(scores, keys: set[str] | None = None) -> dict[tuple[str, int], float]:
    """(key, sentence_index) -> score of a score folder or a DataFrame with those columns; with ``keys``, only their
    rows (a folder is read one part at a time, so a page of 2,000 samples costs one part's memory, not the
    folder's: a million-caption folder held as a dict took gigabytes)."""
    import pandas as pd

    from halsift.corpus.scores import read_scores_df

    cols = ["key", "sentence_index", "score"]
    if isinstance(scores, pd.DataFrame):
        df = scores
    elif keys is None:
        df = read_scores_df(scores, cols)
    else:
        df = _rows_of_keys(scores, keys, cols).to_pandas()
    if keys is not None:
        df = df[df["key"].astype(str).isin(keys)]
    return dict(zip(zip(df["key"].astype(str), df["sentence_index"].astype(int)), df["score"].astype(float)))


def _rows_of_keys(path: str | os.PathLike, keys: set[str], columns: list[str]):
    """The rows of a score folder (or one parquet file) whose key is in ``keys``, read part by part (each part's
    columns checked as :func:`halsift.corpus.scores.read_part` checks them)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from halsift.corpus.scores import ScoresFormatError, read_part

    path = Path(path)
    parts = sorted(p for p in path.glob("*.parquet") if not p.name.startswith(".")) if path.is_dir() else [path]
    if not parts:
        raise ScoresFormatError(f"scores: {path} holds no .parquet parts")
    wanted = pa.array(sorted(keys), pa.string())
    tables = []
    for p in parts:
        t = read_part(p, columns)
        tables.append(t.filter(pc.is_in(t["key"].cast(pa.string()), value_set=wanted)))
    return pa.concat_tables(tables, promote_options="default")


def _sentence_score(scores: Mapping[tuple[str, int], float], key: str, idx: int) -> int | None:
    """A sentence's score, else its whole caption's (``CAPTION_INDEX``), as an int 0–100; None if unscored."""
    from halsift.filtering.detectors.base import CAPTION_INDEX

    v = scores.get((key, idx), scores.get((key, CAPTION_INDEX)))
    return None if v is None or not math.isfinite(v) else int(round(v))


def _top_share(values: Sequence[int | None], keep: float) -> float:
    """The score a unit needs to be in the top ``keep`` share of ``values`` (ties kept)."""
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    if arr.size == 0:
        return math.inf
    n = max(1, int(math.floor(keep * arr.size + 0.5)))
    return float(np.sort(arr)[::-1][min(n, arr.size) - 1])


def _add_threshold_bits(samples: list[dict], filters: Sequence[dict], which: Sequence[int] | None = None) -> None:
    """Kept bits where there is no selection: filter ``j`` (of ``which``, default all) keeps a sentence in its
    detector's top ``keep`` share of these samples."""
    for j, f in enumerate(filters):
        if which is not None and j not in which:
            continue
        d = f["detector"]
        cut = _top_share([t[2][d] for s in samples for t in s["t"]], f["keep"])
        for s in samples:
            for t in s["t"]:
                if t[2][d] is not None and t[2][d] >= cut:
                    t[3] |= 1 << j


class _Builder:
    """Accumulates samples of one or more sets into a :class:`SampleSet`."""

    def __init__(self, detectors: Sequence[str], filters: Sequence[dict]) -> None:
        self.out = SampleSet(detectors=list(detectors), filters=list(filters))
        self._gen: dict[str, int] = {}
        self._thumb_of: dict[str, str] = {}  # image identity -> thumbnail path (bench images repeat per caption)

    def generator(self, name: str) -> int:
        if name not in self._gen:
            self._gen[name] = len(self.out.generators)
            self.out.generators.append(name)
        return self._gen[name]

    def thumb(self, ident: str, read) -> str:
        """Thumbnail path for an image (made once per ``ident``); '' and a skip count when it cannot be decoded."""
        from halsift.corpus.images import ImageDecodeError

        if ident in self._thumb_of:
            return self._thumb_of[ident]
        try:
            data = thumbnail(read(), ident)
        except (ImageDecodeError, OSError) as e:
            why = getattr(e, "kind", type(e).__name__)
            self.out.skipped[f"image {why}"] = self.out.skipped.get(f"image {why}", 0) + 1
            self._thumb_of[ident] = ""
            return ""
        path = f"{SAMPLES_DIR}/{len(self.out.thumbs):06d}.jpg"
        self.out.thumbs[path] = data
        self._thumb_of[ident] = path
        return path


def collect_samples(detectors: Sequence[str], *, corpus: str | os.PathLike | Sequence | None = None,
                    corpus_scores: Mapping[str, str | os.PathLike] | None = None,
                    selections: Mapping[str, tuple[str | os.PathLike, str]] | None = None,
                    bench: str | os.PathLike | None = None,
                    bench_scores: Mapping[str, object] | None = None, keep: float = 0.2,
                    max_samples: int = MAX_SAMPLES) -> SampleSet:
    """The browser's samples: corpus shards and/or bench captions, with every detector's sentence scores.

    ``corpus_scores`` / ``bench_scores``: detector -> score folder (a bench's may also be a DataFrame).
    ``selections``: filter -> (selection folder holding ``kept.parquet``, the detector whose scores it used): a
    corpus sentence is *kept* by a filter when its selection kept it (or its whole caption). The bench has no
    selection, so there a filter keeps the sentences in its detector's top ``keep`` share (precision@keep).
    Without selections every detector is a filter of its own. Labels come from the shard json's ``sentences``
    (synthetic data) and from the bench. At most ``max_samples`` images per set (the first ones).
    """
    detectors = list(detectors)
    if selections:
        filters = [{"name": n, "detector": detectors.index(d), "keep": keep} for n, (_, d) in selections.items()
                   if d in detectors]
    else:
        filters = [{"name": d, "detector": i, "keep": keep} for i, d in enumerate(detectors)]
    b = _Builder(detectors, filters)
    if corpus is not None:
        _corpus_samples(b, corpus, corpus_scores or {}, selections or {}, max_samples)
    if bench is not None:
        _bench_samples(b, bench, bench_scores or {}, max_samples)
    return b.out


def _corpus_samples(b: _Builder, corpus, scores_dirs: Mapping, selections: Mapping, max_samples: int) -> None:
    import pyarrow.parquet as pq

    from halsift.corpus.shards import ShardFormatError, expand_shards, iter_shard, read_sizes, recorded_count
    from halsift.filtering.detectors.base import CAPTION_INDEX
    from halsift.filtering.selection.select import _labels  # the selection's own reading of texts and labels

    set_idx = len(b.out.sets)
    b.out.sets.append("corpus")
    sizes: dict[Path, dict] = {}
    total = shown = 0
    first = len(b.out.samples)
    for path in expand_shards(corpus):
        if shown >= max_samples:  # past the cap: count the rest from what the folder records (no tar read)
            if path.parent not in sizes:
                sizes[path.parent] = read_sizes(path.parent) if (path.parent / "sizes.json").exists() else {}
            n = sizes[path.parent].get(path.name)
            n = recorded_count(path) if n is None else n  # img2dataset: the shard's _stats.json
            if n is not None:
                total += int(n)
                continue
        try:
            for s in iter_shard(path):
                total += 1
                if shown >= max_samples:
                    continue
                shown += 1
                texts, labels, gts = _labels(s.meta, s.caption)
                sents = [[text, LABELS.get(labels[i]) if labels[i] else None, [], 0,
                          (gts[i].get("types") or []) if gts else []] for i, text in enumerate(texts)]
                b.out.samples.append({"k": s.key, "s": set_idx, "g": b.generator(s.captioner or "?"),
                                      "i": b.thumb(f"corpus:{s.key}", lambda s=s: s.image), "t": sents})
        except ShardFormatError:  # the rest of a corrupt shard is counted, not shown; the report goes on
            b.out.skipped["corrupt shard"] = b.out.skipped.get("corrupt shard", 0) + 1
    b.out.totals["corpus"] = total
    # scores and kept bits of the shown samples only: their rows, not the folders' (which may hold millions)
    keys = {smp["k"] for smp in b.out.samples[first:]}
    scores = [(_score_map(scores_dirs[d], keys) if d in scores_dirs and Path(scores_dirs[d]).exists() else {})
              for d in b.out.detectors]
    kept: list[tuple[set, set]] = []  # per filter: kept (key, idx), keys kept whole
    unselected = []  # filters without a selection: kept = their detector's top share, as on the bench
    for j, f in enumerate(b.out.filters):
        sel_dir = Path(selections[f["name"]][0]) if f["name"] in selections else None
        if sel_dir is None or not (sel_dir / "kept.parquet").exists():
            kept.append((set(), set()))
            unselected.append(j)
            continue
        t = (pq.read_table(sel_dir / "kept.parquet", columns=["key", "sentence_index"],
                           filters=[("key", "in", sorted(keys))]).to_pydict()
             if keys else {"key": [], "sentence_index": []})
        pairs = {(k, i) for k, i in zip(t["key"], t["sentence_index"]) if k in keys}
        kept.append((pairs, {k for k, i in pairs if i == CAPTION_INDEX}))
        man = sel_dir / "manifest.json"
        if man.exists():
            flt = json.loads(man.read_text()).get("filter", {})
            f["keep"] = flt.get("keep") or f["keep"]
            f["how"] = flt.get("unit", "") + (f"/{flt['agg']}" if flt.get("agg") else "")
    for smp in b.out.samples[first:]:
        for i, t in enumerate(smp["t"]):
            t[2] = [_sentence_score(sc, smp["k"], i) for sc in scores]
            t[3] = sum(1 << j for j, (pairs, whole) in enumerate(kept) if (smp["k"], i) in pairs or smp["k"] in whole)
    if unselected:
        _add_threshold_bits(b.out.samples[first:], b.out.filters, unselected)


def _bench_samples(b: _Builder, bench_path, scores_in: Mapping, max_samples: int) -> None:
    import pandas as pd

    from halsift.corpus.bench import image_path, read_bench

    set_idx = len(b.out.sets)
    b.out.sets.append("bench")
    scores = [{} if (src := scores_in.get(d)) is None or (not isinstance(src, pd.DataFrame) and not Path(src).exists())
              else _score_map(src) for d in b.out.detectors]
    captions: dict[tuple[str, str, str], list] = {}
    for row in read_bench(bench_path):
        captions.setdefault((row.image_id, row.generator, row.caption_id), []).append(row)
    first = len(b.out.samples)
    for (image_id, gen, cap_id), rows in list(captions.items())[:max_samples]:
        rows.sort(key=lambda r: r.position)
        img = image_path(bench_path, rows[0])
        sents = [[r.sentence, LABELS.get(r.label), [_sentence_score(sc, r.id, r.position) for sc in scores], 0,
                  list(r.types)] for r in rows]
        b.out.samples.append({"k": f"{image_id}/{gen}/{cap_id}", "s": set_idx, "g": b.generator(gen),
                              "i": b.thumb(f"bench:{img}", img.read_bytes), "t": sents})
    b.out.totals["bench"] = len(captions)
    _add_threshold_bits(b.out.samples[first:], b.out.filters)


# --------------------------------------------------------------------------------------------- page sections
def figure(path: str | os.PathLike, title: str) -> dict | None:
    """A plot for the page: ``{"title", "src"}`` with the PNG inlined as a data URI (None if the file is absent)."""
    path = Path(path)
    if not path.exists():
        return None
    return {"title": title, "src": "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")}


def bench_figures(plots_dir: str | os.PathLike) -> list[dict]:
    """The bench plots found in ``plots_dir`` as inlined figures for index.html, in :data:`PLOT_TITLES` order."""
    from halsift.eval.report.bench import PLOT_TITLES

    return [f for f in (figure(Path(plots_dir) / n, t) for n, t in PLOT_TITLES.items()) if f]


def _f(v, digits: int = 1) -> str:
    return "–" if v is None or not isinstance(v, (int, float)) or not math.isfinite(v) else f"{v:.{digits}f}"


def bench_tables(metrics: Mapping[str, float], detectors: Sequence[str],
                 generators: Sequence[str] | None = None) -> list[dict]:
    """Tables from a bench ``metrics.json``: AUROC per generator with 95% CIs, mean score of incorrect sentences
    per hallucination type, mean score by sentence position. Each ``{"title", "header", "rows"}``."""
    def prefix(d: str) -> str:
        return f"{d}/" if f"{d}/auroc/mean" in metrics or f"{d}/n_scored" in metrics else ""

    dets = [d for d in detectors if f"{prefix(d)}auroc/mean" in metrics or f"{prefix(d)}n_scored" in metrics]
    if not dets:
        return []
    if generators is None:
        found = {k.split("auroc/", 1)[1] for d in dets for k in metrics if k.startswith(f"{prefix(d)}auroc/")}
        generators = sorted(found - {"mean", "i2t", "t2i"})
    cols = ["mean", "i2t", "t2i", *generators]
    cols = [c for c in cols if any(f"{prefix(d)}auroc/{c}" in metrics for d in dets)]

    def with_ci(d: str, c: str) -> str:
        p = prefix(d)
        v, lo, hi = (metrics.get(f"{p}{k}/{c}") for k in ("auroc", "auroc_lo", "auroc_hi"))
        return f"{_f(v)} [{_f(lo)}, {_f(hi)}]" if lo is not None and hi is not None else _f(v)

    tables = [{"title": "Sentence-level AUROC per generator, 95% bootstrap CI over images (AlignBench Table 3)",
               "header": ["Detector", *cols], "rows": [[d, *[with_ci(d, c) for c in cols]] for d in dets]}]
    types = sorted({k.split("type_score/", 1)[1] for d in dets for k in metrics
                    if k.startswith(f"{prefix(d)}type_score/")})
    if types:
        tables.append({"title": "Mean score of hallucinated sentences per hallucination type (lower is better)",
                       "header": ["Detector", *types],
                       "rows": [[d, *[_f(metrics.get(f"{prefix(d)}type_score/{t}")) for t in types]] for d in dets]})
    pos = sorted({int(k.split("/")[-2]) for d in dets for k in metrics
                  if k.startswith(f"{prefix(d)}position/") and k.count("/") == prefix(d).count("/") + 2})
    if pos:
        rows = [[d, lab, *[_f(metrics.get(f"{prefix(d)}position/{i}/{lab}")) for i in pos]]
                for d in dets for lab in ("correct", "incorrect")]
        rows.append(["(bench)", "incorrect %", *[_f(metrics[f"bench/incorrect_rate/{i}"])
                                                 if f"bench/incorrect_rate/{i}" in metrics else "–" for i in pos]])
        tables.append({"title": "Mean score by sentence position (1 = first sentence)",
                       "header": ["Detector", "label", *[str(i + 1) for i in pos]], "rows": rows})
    return tables


def markdown_html(text: str) -> str:
    """A markdown fragment (the report's answer sentence) as HTML, through markdown-it (raw HTML escaped)."""
    from markdown_it import MarkdownIt

    return MarkdownIt("commonmark", {"html": False}).render(text)


def template_env():
    """The Jinja2 environment of halsift's pages: every ``{{ value }}`` HTML-escaped (autoescape on for every
    template), and ``tojson`` is :func:`script_json`."""
    import jinja2
    from markupsafe import Markup

    env = jinja2.Environment(loader=jinja2.PackageLoader("halsift.eval.report", "templates"), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["tojson"] = lambda value: Markup(script_json(value))
    return env


def render_html(out_dir: str | os.PathLike, title: str, *, headline: str = "", table: dict | None = None,
                notes: Sequence[str] = (), figures: Sequence[dict | None] = (), tables: Sequence[dict] = (),
                samples: SampleSet | None = None, links: Mapping[str, str] | None = None,
                tables_title: str = "") -> Path:
    """Write ``out_dir/index.html`` (and the thumbnails under ``samples/``); returns its path.

    ``headline`` and ``notes`` are markdown; ``table`` is ``{"header", "rows": [{"cells", "filter"}]}`` where a
    row's ``filter`` (a name in ``samples.filters``) links it to that filter's kept/dropped samples; ``tables`` are
    plain ``{"title", "header", "rows"}`` (their section: ``tables_title``, default "Detection benchmark");
    ``links``: other reports, name -> relative path.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    samples = samples or SampleSet()
    remove_tree(out / SAMPLES_DIR, ignore_errors=True)  # no thumbnails left from an earlier page
    for rel, data in samples.thumbs.items():
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with naming_errors(target):
            target.write_bytes(data)
    filter_names = {f["name"] for f in samples.filters}
    html = template_env().get_template("report.html.j2").render(
        title=title, headline=markdown_html(headline) if headline else "", table=table,
        notes=[markdown_html(n) for n in notes], figures=[f for f in figures if f], tables=list(tables),
        samples=samples, samples_json=samples.to_json(), filter_names=filter_names, links=dict(links or {}),
        tables_title=tables_title,
        shown=Counter(samples.sets[s["s"]] for s in samples.samples))
    html = html.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate in a name (no UTF-8 for it): '?'
    return write_text_atomic(out / "index.html", html)


@contextlib.contextmanager
def wandb_data_dir(path: str | os.PathLike):
    """Stage wandb's artifact files (a Table's images) under ``path`` — beside the offline run instead of the
    user's home — unless ``WANDB_DATA_DIR`` is set; restored on exit."""
    if os.environ.get("WANDB_DATA_DIR"):
        yield
        return
    os.environ["WANDB_DATA_DIR"] = str(path)
    try:
        yield
    finally:
        os.environ.pop("WANDB_DATA_DIR", None)


def log_samples_table(run, samples: SampleSet, out_dir: str | os.PathLike, key: str = "samples") -> None:
    """Log the samples to a wandb run as a ``wandb.Table``: one row per image, with its ``wandb.Image``, set,
    generator, key, the caption's sentences with their labels, and per detector its sentence scores (text) and
    lowest sentence score (sortable), and per filter how many sentences it kept. wandb stores a Table with media
    as a run artifact: offline, its files are staged under ``WANDB_DATA_DIR`` until ``wandb sync``."""
    import wandb

    out = Path(out_dir)
    cols = ["image", "set", "generator", "key", "sentences", "labels"]
    cols += [c for d in samples.detectors for c in (f"{d}/min", f"{d}/scores")]
    cols += [f"kept/{f['name']}" for f in samples.filters]
    table = wandb.Table(columns=cols)
    for s in samples.samples:
        sents = s["t"]
        row = [wandb.Image(str(out / s["i"])) if s["i"] else None, samples.sets[s["s"]],
               samples.generators[s["g"]], s["k"], "\n".join(t[0] for t in sents),
               " ".join(t[1] or "-" for t in sents)]
        for j in range(len(samples.detectors)):
            vals = [t[2][j] for t in sents]
            have = [v for v in vals if v is not None]
            row += [min(have) if have else None, " ".join("-" if v is None else str(v) for v in vals)]
        row += [sum(1 for t in sents if t[3] >> j & 1) for j in range(len(samples.filters))]
        table.add_data(*row)
    run.log({key: table})


def write_bench_html(out_dir: str | os.PathLike, bench_path: str | os.PathLike, results: Sequence,
                     metrics: Mapping[str, float], keep: float = 0.2, max_samples: int = MAX_SAMPLES) -> Path:
    """``index.html`` of ``eval bench``: the best detector's AUROC, the bench tables and plots, and the bench's
    captions in the sample browser (a detector keeps the sentences in its top ``keep`` share)."""
    import pandas as pd

    from halsift.corpus.bench import iter_bench
    from halsift.eval.report.bench import generator_order

    names = [r.name for r in results]
    scores = {r.name: r.scored[["id", "position", "score"]].rename(columns={"id": "key", "position": "sentence_index"})
              for r in results}
    samples = collect_samples(names, bench=bench_path, bench_scores=scores, keep=keep, max_samples=max_samples)
    frame = pd.DataFrame([{"generator": r.generator, "generator_type": r.generator_type}
                          for r in iter_bench(bench_path)])
    gens = [g for g, _ in generator_order(frame)]
    ranked = sorted((r for r in results if r.aurocs.get("auroc/mean") is not None),
                    key=lambda r: r.aurocs["auroc/mean"], reverse=True)
    headline = ""
    if ranked:
        best = ranked[0]
        lo, hi = best.cis.get("auroc/mean", (float("nan"), float("nan")))
        headline = (f"**Best detector on the bench: `{best.name}`**, mean AUROC over generators "
                    f"{_f(best.aurocs['auroc/mean'])} (95% CI {_f(lo)}–{_f(hi)}) of {len(results)} evaluated.")
    return render_html(out_dir, "detection benchmark", headline=headline,
                       figures=bench_figures(Path(out_dir) / "plots"),
                       tables=bench_tables(metrics, names, gens), samples=samples, links={"report.md": "report.md"})



def write_select_html(out_dir: str | os.PathLike, scores_dir: str | os.PathLike, data, manifest: Mapping,
                      max_samples: int = MAX_SAMPLES) -> Path:
    """``index.html`` of ``halsift select``: the input shards' captions with their scores, marked kept or dropped
    by this selection, and the kept precision where the shards carry labels."""
    from halsift.corpus.scores import ScoresFormatError
    from halsift.filtering.selection.manifest_scale import on_percent_scale

    recorded = (manifest.get("filter") or {}).get("detector")  # the checked score folder's detector
    try:
        names = [recorded] if recorded else _detectors(scores_dir)
    except ScoresFormatError:  # a score table without the column: the folder names the detector
        names = []
    name = str(names[0]) if len(names) == 1 else Path(scores_dir).name
    samples = collect_samples([name], corpus=data, corpus_scores={name: scores_dir},
                              selections={name: (out_dir, name)}, max_samples=max_samples)
    prec = on_percent_scale(manifest).get("precision", {})
    line = (f"**`{name}` kept {manifest.get('kept_units')} of {manifest.get('candidates')} units**"
            + (f"; precision {prec['input']:.1f}% → {prec['kept']:.1f}% (share of correct sentences)."
               if isinstance(prec.get("input"), (int, float)) and isinstance(prec.get("kept"), (int, float)) else "."))
    from halsift.eval.report.compose_tables import composition_tables

    return render_html(out_dir, f"selection {Path(out_dir).name}", headline=line, samples=samples,
                       links={"manifest.json": "manifest.json"}, tables=composition_tables(manifest.get("composition")),
                       tables_title="Composed selection")


def _detectors(scores_dir: str | os.PathLike) -> list[str]:
    """The detectors a score folder's parts hold, one part at a time (dictionary-encoded: a few bytes per row)."""
    from halsift.corpus.scores import ScoresFormatError, read_part

    path = Path(scores_dir)
    parts = sorted(p for p in path.glob("*.parquet") if not p.name.startswith(".")) if path.is_dir() else [path]
    if not parts:
        raise ScoresFormatError(f"scores: {path} holds no .parquet parts")
    names: set[str] = set()
    for p in parts:
        names.update(str(x) for x in read_part(p, ["detector"], read_dictionary=["detector"])["detector"].unique()
                     .to_pylist())
    return sorted(names)
