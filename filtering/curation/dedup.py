"""``halsift dedup``: exact and near duplicates of a corpus, and its leaks of evaluation images (docs/curation.md).

Passes: (1) one descriptor part per shard (:mod:`.hash_parts`, resumable); (2) exact groups from sorted hash
columns (DuckDB); (3) near pairs: phash within ``phash_distance`` bits confirmed by thumbnail cosine >=
``near_thumbnail`` (:func:`.search.hamming_pairs_sql`), and with embeddings cosine >= ``cosine`` (clustered
:func:`.search.cosine_pairs`); (4) evaluation leaks: each corpus image's best match among the ``--against`` images
(thumbnail with crop variants >= ``eval_thumbnail``; embedding >= ``cosine``). Groups are connected components of
exact and near pairs; the first key in corpus order represents its group, every other member is listed; a leak is
listed with reason ``eval`` whatever its group. Passes (2)-(4) read the parts (DuckDB over their parquet files
under a memory limit, thumbnails part by part): no per-sample Python object, memory flat in the corpus size.

Refused in one line (:class:`DedupError`), before the work where it can be: an ``--out`` folder that holds another
stage's output (a ``manifest.json`` that is not dedup's, shards, a ``kept.parquet``); ``--against`` shards that are
the corpus's own shards; and, after the search, a result listing more than :data:`MAX_SHARE` of the corpus as leaks
or as duplicates (an evaluation set that is the corpus, a model that sees every image alike) unless
``allow_implausible``.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from halsift.corpus.errors import InputError
from halsift.corpus.images import SkipCounter
from halsift.execution.run_folder import check_or_start
from halsift.corpus.progress import progress
from halsift.corpus.sample import key_in_two_inputs, nothing_read
from halsift.corpus.scores import write_part_atomic
from halsift.corpus.shards import expand_shards, write_json_atomic
from halsift.filtering.curation import DUPLICATES
from halsift.filtering.curation.descriptors import THUMB_DIM, crop_variants, thumb_vectors, thumbnail
from halsift.filtering.curation.hash_parts import part_path
from halsift.filtering.curation.search import best_matches, cosine_pairs, hamming_pairs_sql

EXACT, NEAR = 0, 1
MANIFEST = "manifest.json"
FORMAT = "halsift-dedup/1"
EVAL_BATCH = 16384  # corpus thumbnails compared with the evaluation side at once
DUCKDB_MEMORY = "256MB"  # the exact grouping, phash joins and key joins spill to disk above this

MAX_SHARE = 0.5  # more of the corpus listed as leaks (or as duplicates) than this is implausible: refused


class DedupError(InputError):
    """Dedup inputs or a result it refuses (the message names the file or the share, and the way out)."""


def check_out_folder(out: Path) -> None:
    """Refuse an ``--out`` that holds another stage's shards or selection without a manifest (a foreign manifest is
    refused by the run-folder check before this)."""
    if not out.is_dir():
        return
    other = next((p for p in out.iterdir() if p.suffix == ".tar" or p.name in ("kept.parquet", "sizes.json")), None)
    if other is not None:
        raise DedupError(f"--out {out}: holds another stage's output ({other.name}); give dedup a folder of its own")


def check_against_not_corpus(shards: list[Path], against: list[str]) -> None:
    """Refuse an ``--against`` set whose tar files include one of the corpus's own shards (same file)."""
    from halsift.filtering.curation.against import kind_of

    own = {_file_id(s): s for s in shards}
    for a in against:
        kind = kind_of(a)
        if kind == "shards":
            tars = expand_shards(a)
        elif kind == "wds":
            tars = sorted(Path(a).glob("*/*.tar"))
        else:
            continue
        hit = next((t for t in tars if _file_id(t) in own), None)
        if hit is not None:
            raise DedupError(f"--against {a}: holds the corpus's own shard {own[_file_id(hit)]}; every sample would "
                             "be its own leak (give the evaluation images, not the corpus)")


def _file_id(p: Path) -> tuple[int, int]:
    st = os.stat(p)
    return st.st_dev, st.st_ino


def _refuse_repeated_keys(parts: "_Parts", con, shards: list[Path]) -> None:
    """A key names one sample: within a shard a repeat is skipped as ``duplicate`` (the reader's rule); a key in
    two shards is refused with the rule's one line (:func:`~halsift.corpus.sample.key_in_two_inputs`, naming both
    shards). One DuckDB query over the parts (view ``parts``), so no per-sample Python object."""
    hit = con.execute("SELECT key, min(i), max(i) FROM parts GROUP BY key HAVING count(*) > 1 LIMIT 1").fetchone()
    if hit is None:
        return
    key, a, b = hit
    where = [shards[int(np.searchsorted(parts.offsets, r, side="right") - 1)].name for r in (a, b)]
    raise DedupError(key_in_two_inputs(key, where[0], where[1], "dedup"))


def check_share(n: int, counts: dict[str, int], allow: bool) -> None:
    """Refuse a result listing more than :data:`MAX_SHARE` of ``n`` samples as leaks, or as duplicates."""
    if allow or n == 0:
        return
    for what, count, hint in (
            ("evaluation leaks", counts["eval"], "is an --against set the corpus itself, or the model random?"),
            ("duplicates", counts["exact"] + counts["near"], "are the thresholds loose, or the model random?")):
        if count > MAX_SHARE * n:
            raise DedupError(f"dedup: {count} of {n} samples ({100 * count / n:.0f}%) would be listed as {what}; "
                             f"more than {100 * MAX_SHARE:.0f}% is implausible ({hint}); pass --allow-implausible "
                             "to write it anyway")


def _corpus_parts(shards: list[Path], out: Path) -> tuple[list[Path], SkipCounter]:
    """The per-shard part of every shard (made by :func:`.hash_parts.shard_stage`) and its skipped samples. Only
    each part's footer is read here: the global part streams the parts' columns as it needs them."""
    skipped, parts = SkipCounter(), []
    for shard in shards:
        path = part_path(out / "_parts", shard)
        info = json.loads((pq.read_metadata(path).metadata or {}).get(b"halsift", b"{}"))
        skipped.merge(SkipCounter.from_json(info.get("skipped", {})))
        parts.append(path)
    return parts, skipped


class _Parts:
    """The corpus as its descriptor parts (corpus order): global row ``i`` is row ``i - offsets[p]`` of part ``p``.
    Columns are read one part at a time with column projection; nothing holds a per-sample Python object."""

    def __init__(self, paths: list[Path]):
        self.paths = list(paths)
        counts = [pq.read_metadata(p).num_rows for p in self.paths]
        self.offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        self.n = int(self.offsets[-1])

    def column(self, p: int, name: str) -> pa.ChunkedArray:
        return pq.read_table(self.paths[p], columns=[name]).column(name)

    def fixed(self, p: int, name: str, width: int) -> np.ndarray:
        """A fixed-width binary column of part ``p`` as uint8 ``[rows, width]`` (zero-copy from Arrow)."""
        col = self.column(p, name)
        try:
            arr = col.cast(pa.binary(width)).combine_chunks()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
            raise InputError(f"dedup: {self.paths[p]} column {name!r} is not {width}-byte values ({e}); delete "
                             "the part to make it again") from e
        data = np.frombuffer(arr.buffers()[1], np.uint8) if len(arr) else np.empty(0, np.uint8)
        return data[arr.offset * width:(arr.offset + len(arr)) * width].reshape(len(arr), width)

    def blocks(self, name: str, width: int):
        """``fixed(name)`` of each part in turn (a stream over the corpus)."""
        for p in range(len(self.paths)):
            yield self.fixed(p, name, width)

    def take(self, rows: np.ndarray, name: str, width: int | None = None):
        """Column ``name`` at sorted unique global ``rows``: uint8 ``[len, width]`` (``width``) or an Arrow array,
        read part by part (only the parts that hold one of ``rows``)."""
        got = []
        part_of = np.searchsorted(self.offsets, rows, side="right") - 1
        for p in np.unique(part_of):
            local = rows[part_of == p] - self.offsets[p]
            if width is None:
                got.append(self.column(int(p), name).take(pa.array(local)).combine_chunks())
            else:
                got.append(self.fixed(int(p), name, width)[local])
        if width is None:
            return pa.concat_arrays(got) if got else pa.array([], pa.string())
        return np.concatenate(got) if got else np.empty((0, width), np.uint8)

    def sql_view(self, con, name: str = "parts") -> None:
        """Register view ``name`` (the parts' columns + global row ``i``) on DuckDB connection ``con``."""
        con.register("_offsets", pa.table({"f": [str(p) for p in self.paths],
                                           "o": pa.array(self.offsets[:-1], pa.int64())}))
        files = ", ".join("'" + str(p).replace("'", "''") + "'" for p in self.paths)
        con.execute(f"CREATE TEMP VIEW {name} AS SELECT p.*, p.file_row_number + o.o AS i FROM "
                    f"read_parquet([{files}], filename=true, file_row_number=true) p "
                    "JOIN _offsets o ON p.filename = o.f")


def _rechunk(blocks, size: int):
    """The rows of ``blocks`` regrouped into blocks of ``size`` rows (the last shorter): the search sees the same
    batches whatever the shard sizes, so its float results do not depend on them."""
    buf, have = [], 0
    for b in blocks:
        while len(b):
            buf.append(b[:size - have])
            have += len(buf[-1])
            b = b[len(buf[-1]):]
            if have == size:
                yield np.concatenate(buf)
                buf, have = [], 0
    if have:
        yield np.concatenate(buf)


def _duckdb(work: Path):
    """A DuckDB connection that spills to ``work`` above a fixed memory limit (the grouping runs out of core)."""
    import duckdb

    work.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    con.execute(f"SET memory_limit='{DUCKDB_MEMORY}'")
    con.execute("SET temp_directory='" + str(work).replace("'", "''") + "'")
    con.execute("SET preserve_insertion_order=false")
    return con


def _exact_pairs(parts: _Parts, on: str, con) -> tuple[np.ndarray, np.ndarray]:
    """Each row whose hash (``on``: image, caption or pair) repeats an earlier row: ``(row, first row)``."""
    if parts.n == 0:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    h = "image_sha" if on == "image" else "caption_sha" if on == "caption" else "image_sha || caption_sha"
    res = con.execute(f"WITH t AS (SELECT {h} AS h, i FROM parts), "
                      "g AS (SELECT h, min(i) AS r FROM t GROUP BY h HAVING count(*) > 1) "
                      "SELECT t.i AS i, g.r AS r FROM t JOIN g ON t.h = g.h WHERE t.i > g.r").fetchnumpy()
    return np.asarray(res["i"], np.int64), np.asarray(res["r"], np.int64)


def _thumb_cos(parts: _Parts, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Thumbnail cosine of each pair ``(a[k], b[k])``: only the thumbnails of rows in a pair are read."""
    if len(a) == 0:
        return np.empty(0, np.float32)
    rows = np.unique(np.concatenate([a, b]))
    vec = thumb_vectors(parts.take(rows, "thumb", THUMB_DIM))
    return np.einsum("ij,ij->i", vec[np.searchsorted(rows, a)], vec[np.searchsorted(rows, b)]).astype(np.float32)


def _groups(edges: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]]):
    """``(rows, representative row, chosen partner row, similarity, reason code)`` of each row in an edge (every
    other row is its own group), over the edge lists: memory in proportion to the edges, not to the corpus."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    a = np.concatenate([e[0] for e in edges] + [np.empty(0, np.int64)])
    b = np.concatenate([e[1] for e in edges] + [np.empty(0, np.int64)])
    sim = np.concatenate([e[2] for e in edges] + [np.empty(0, np.float32)]).astype(np.float32)
    code = np.concatenate([np.full(len(e[0]), e[3], np.int8) for e in edges] + [np.empty(0, np.int8)])
    nodes = np.unique(np.concatenate([a, b]))  # sorted: compact ids keep corpus order
    n = len(nodes)
    if n == 0:
        return nodes, nodes, nodes, np.empty(0, np.float32), np.empty(0, np.int8)
    a, b = np.searchsorted(nodes, a), np.searchsorted(nodes, b)
    _, label = connected_components(coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n)), directed=False)
    rep = np.full(label.max() + 1, n, np.int64)
    np.minimum.at(rep, label, np.arange(n))
    rep_of = rep[label]
    # each member's partner: its edge to the representative if any, else its strongest edge (exact first)
    src, dst = np.concatenate([a, b]), np.concatenate([b, a])
    s2, c2 = np.concatenate([sim, sim]), np.concatenate([code, code])
    to_rep = dst == rep_of[src]
    order = np.lexsort((dst, -s2, c2, ~to_rep, src))  # by src; to-rep first, exact first, highest sim, earliest
    first = np.ones(len(order), bool)
    first[1:] = src[order][1:] != src[order][:-1]
    pick = order[first]
    partner = np.full(n, -1, np.int64)
    psim = np.zeros(n, np.float32)
    pcode = np.full(n, -1, np.int8)
    partner[src[pick]], psim[src[pick]], pcode[src[pick]] = dst[pick], s2[pick], c2[pick]
    return nodes, nodes[rep_of], nodes[partner], psim, pcode


def _against_refs(paths: list[str], encoder, show: bool) -> tuple[dict, SkipCounter]:
    """Thumbnail vectors of every crop variant of every ``--against`` image (and embeddings with ``encoder``)."""
    from halsift.filtering.curation.against import iter_images

    skipped = SkipCounter()
    ids: list[str] = []
    per_set: list[int] = []
    thumbs, owner, images = [], [], []
    with progress(desc="dedup: against", unit="img", disable=not show) as bar:
        for path in paths:
            before = len(ids)
            for image_id, img in iter_images(path, skipped):
                for v in crop_variants(img):
                    thumbs.append(np.frombuffer(thumbnail(v), np.uint8))
                    owner.append(len(ids))
                if encoder is not None:
                    images.append(img)
                ids.append(image_id)
                bar.update()
            per_set.append(len(ids) - before)
    refs = {"ids": ids, "per_set": per_set, "owner": np.asarray(owner, np.int64),
            "thumbs": thumb_vectors(np.stack(thumbs)) if thumbs else np.empty((0, THUMB_DIM), np.float32)}
    if encoder is not None:
        refs["emb"] = encoder(images) if images else None
    return refs, skipped


def _embedding_rows(folder: Path, con):
    """``(chunks factory, rows, dim, model)``: the store's image vectors of corpus keys, in store order; ``rows``
    maps them to corpus rows (a key's first row), joined in DuckDB on the ``parts`` view of ``con``."""
    from halsift.corpus.embedding_store import IMAGE, iter_embeddings, part_paths, read_manifest

    manifest = read_manifest(folder)
    paths = part_paths(folder)
    rows = []
    if paths:
        con.register("_store", pa.table({"f": [str(p) for p in paths], "p": pa.array(range(len(paths)), pa.int64())}))
        files = ", ".join("'" + str(p).replace("'", "''") + "'" for p in paths)
        res = con.execute(
            f"WITH e AS (SELECT s.p, e.file_row_number AS j, e.key FROM read_parquet([{files}], filename=true, "
            f"file_row_number=true) e JOIN _store s ON e.filename = s.f WHERE e.sentence_index = {IMAGE}), "
            "c AS (SELECT key, min(i) AS r FROM parts GROUP BY key) "
            "SELECT e.p AS p, coalesce(c.r, -1) AS r FROM e LEFT JOIN c ON e.key = c.key ORDER BY e.p, e.j"
        ).fetchnumpy()
        p, r = np.asarray(res["p"], np.int64), np.asarray(res["r"], np.int64)
        cuts = np.searchsorted(p, np.arange(len(paths) + 1))
        rows = [r[cuts[k]:cuts[k + 1]] for k in range(len(paths))]
    rows_all = np.concatenate(rows) if rows else np.empty(0, np.int64)

    def chunks():
        for e, r in zip(iter_embeddings(folder), rows):
            yield e.vectors[r >= 0].astype(np.float32)

    return chunks, rows_all[rows_all >= 0], int(manifest["dim"]), manifest["model"]


def run_dedup(data: str, out: str | Path, against: list[str] = (), embeddings: str | None = None,
              model: str | None = None, exact_on: str = "image", phash_distance: int = 4,
              near_thumbnail: float = 0.97, eval_thumbnail: float = 0.92, cosine: float = 0.95,
              nprobe: int = 8, show_progress: bool = True, allow_implausible: bool = False, engine: str = "local",
              **engine_flags) -> dict:
    """Write ``out/duplicates.parquet`` and ``out/manifest.json``; returns the manifest (module docstring).
    ``engine``/``engine_flags`` (``num_tasks``, ``task_index``, ``decode_workers`` ...): the per-shard part on the
    execution layer's engines (:func:`.hash_parts.shard_stage`); a task run writes its parts only and returns
    ``{"status": "parts", ...}``."""
    from halsift.filtering.curation.against import kind_of

    t0 = time.time()
    out = Path(out)
    for a in against:  # refuse a bad --against before any work
        kind_of(a)
    # a folder holding another stage's manifest (a selection, scores ...) is never overwritten
    check_or_start(out, {"format": FORMAT}, keys=("format",), what="another stage's output", manifest=MANIFEST,
                   error=InputError, parts_glob="", start=False, hint="choose a new folder", prefix="out: ")
    shards = expand_shards(data)
    check_out_folder(out)
    check_against_not_corpus(shards, list(against))
    out.mkdir(parents=True, exist_ok=True)
    from halsift.filtering.curation.hash_parts import shard_stage

    staged = shard_stage(shards, out, model, show_progress, engine, **engine_flags)
    if staged.engine == "tasks":  # a task writes its parts only; a plain run afterwards does the global part
        return {"status": "parts", "complete": staged.complete, "lines": staged.lines, **staged.stats}
    timing: dict[str, float] = {}
    part_files, skipped = _corpus_parts(shards, out)
    reused = staged.stats["reused"]
    empty = nothing_read(sum(pq.read_metadata(f).num_rows for f in part_files), skipped.to_json(), "dedup")
    if empty:
        raise DedupError(f"dedup: {data}: {empty}")
    timing["hash_s"] = time.time() - t0
    parts = _Parts(part_files)
    n = parts.n
    work = out / "_work"
    con = _duckdb(work / "duckdb")
    try:
        parts.sql_view(con)
        _refuse_repeated_keys(parts, con, shards)

        t = time.time()
        ea, eb = _exact_pairs(parts, exact_on, con)
        edges = [(ea, eb, np.ones(len(ea), np.float32), EXACT)]
        with progress(total=n, desc="dedup: phash", unit="img", disable=not show_progress) as bar:
            pa_, pb, dist = hamming_pairs_sql(con, "SELECT i, phash FROM parts", n, phash_distance, bar)
        tc = _thumb_cos(parts, pa_, pb)
        ok = tc >= near_thumbnail
        edges.append((pa_[ok], pb[ok], tc[ok], NEAR))
        counts_near = {"phash_candidates": int(len(pa_)), "phash_confirmed": int(ok.sum())}
        timing["near_hash_s"] = time.time() - t

        encoder, model_name, emb_folder = None, None, None
        if model:
            from halsift.filtering.curation.encode import cached_encoder, encode_corpus

            t = time.time()
            encoder = cached_encoder(model)  # the one the shard parts were just encoded with (loaded once)
            emb_folder = out / "embeddings"
            with progress(total=len(shards), desc="dedup: encode", unit="shard", disable=not show_progress) as bar:
                encode_corpus(shards, emb_folder, encoder, bar)
            timing["encode_s"] = time.time() - t
        elif embeddings:
            from halsift.corpus.embedding_store import check_embedded_from

            emb_folder = Path(embeddings)
            check_embedded_from(emb_folder, shards)  # vectors of the shards' content now, or one line
        emb_rows = None
        if emb_folder is not None:
            t = time.time()
            chunks, emb_rows, dim, model_name = _embedding_rows(emb_folder, con)
            with progress(total=len(emb_rows), desc="dedup: semantic", unit="img", disable=not show_progress) as bar:
                sa, sb, ss = cosine_pairs(chunks, len(emb_rows), dim, cosine, nprobe=nprobe, bar=bar,
                                          spill_dir=work / "ivf")
            a2, b2 = emb_rows[sa], emb_rows[sb]
            edges.append((np.minimum(a2, b2), np.maximum(a2, b2), ss, NEAR))
            counts_near["embedding_pairs"] = int(len(sa))
            timing["near_embedding_s"] = time.time() - t
    finally:
        con.close()
        shutil.rmtree(work, ignore_errors=True)

    leak_row, leak_ref, leak_sim = np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)
    refs, against_skipped = None, SkipCounter()
    if against:
        t = time.time()
        if encoder is None and emb_folder is not None:
            from halsift.filtering.curation.encode import ImageEncoder

            encoder = ImageEncoder(model_name)  # the store's model encodes the (small) evaluation side
        refs, against_skipped = _against_refs(list(against), encoder, show_progress)
        with progress(total=n, desc="dedup: eval", unit="img", disable=not show_progress) as bar:
            tv = (thumb_vectors(b) for b in _rechunk(parts.blocks("thumb", THUMB_DIM), EVAL_BATCH))
            leak_row, leak_ref, leak_sim = best_matches(tv, refs["thumbs"], refs["owner"], eval_thumbnail, bar)
        if refs.get("emb") is not None and emb_rows is not None:
            from halsift.corpus.embedding_store import Embeddings, check_dim

            emb = refs["emb"]
            check_dim(Embeddings(np.empty(0, object), np.empty(0, np.int32), emb, model_name), dim,
                      f"the --against images encoded by {model_name}")
            r2, o2, s2 = best_matches(chunks(), emb, np.arange(len(emb)), cosine)
            leak_row = np.concatenate([leak_row, emb_rows[r2]])
            leak_ref, leak_sim = np.concatenate([leak_ref, o2]), np.concatenate([leak_sim, s2])
        timing["eval_s"] = time.time() - t

    rows = _rows(parts, edges, leak_row, leak_ref, leak_sim, refs["ids"] if refs else [])
    counts = {r: int(pc.sum(pc.equal(rows.column("reason"), r)).as_py() or 0) for r in ("exact", "near", "eval")}
    check_share(n, counts, allow_implausible)
    write_part_atomic(rows, out / DUPLICATES)
    manifest = {
        "format": FORMAT, "data": str(data), "shards": len(shards), "shards_reused": reused,
        "samples": n, "skipped": skipped.to_json(),
        "against": [{"path": str(a), "images": c} for a, c in zip(against, refs["per_set"] if refs else [])],
        "against_skipped": against_skipped.to_json(),
        "embeddings": str(emb_folder) if emb_folder else None, "model": model_name,
        "thresholds": {"exact_on": exact_on, "phash_distance": phash_distance, "near_thumbnail": near_thumbnail,
                       "eval_thumbnail": eval_thumbnail, "cosine": cosine if emb_folder else None,
                       "nprobe": nprobe},
        "counts": counts, "removed": len(rows),
        "groups": int(pc.count_distinct(rows.column("group")).as_py()) if len(rows) else 0,
        "pairs": {"exact": int(len(ea)), **counts_near},
        "timing_s": {k: round(v, 3) for k, v in {**timing, "total_s": time.time() - t0}.items()},
    }
    write_json_atomic(out / MANIFEST, manifest)
    return manifest


def _rows(parts: _Parts, edges, leak_row, leak_ref, leak_sim, ref_ids: list[str]) -> pa.Table:
    """duplicates.parquet in corpus order: eval rows (best match per corpus row, the first of equals) and the
    non-representative group members; keys are read from the parts for the listed rows only."""
    order = np.lexsort((np.arange(len(leak_row)), -leak_sim, leak_row))
    first = np.ones(len(order), bool)
    first[1:] = leak_row[order][1:] != leak_row[order][:-1]
    best = order[first]
    e_row, e_ref, e_sim = leak_row[best], leak_ref[best], leak_sim[best].astype(np.float32)
    nodes, rep, partner, psim, pcode = _groups(edges)
    dup = (rep != nodes) & ~np.isin(nodes, e_row)
    d_row, d_rep, d_partner = nodes[dup], rep[dup], partner[dup]
    rows = np.concatenate([e_row, d_row])
    at = np.argsort(rows, kind="stable")
    need = np.unique(np.concatenate([rows, d_rep, d_partner]))
    keys = parts.take(need, "key").cast(pa.string())
    ids = pa.array(ref_ids, pa.string())
    # one lookup table: the needed keys, then the reference ids
    names = pa.concat_arrays([keys, ids])
    look = lambda r: np.searchsorted(need, r)  # noqa: E731
    group = np.concatenate([len(need) + e_ref, look(d_rep)])[at]
    matched = np.concatenate([len(need) + e_ref, look(d_partner)])[at]
    reason = np.concatenate([np.full(len(e_row), 0, np.int8), np.where(pcode[dup] == EXACT, 1, 2).astype(np.int8)])
    return pa.table({"key": keys.take(pa.array(look(rows[at]))), "group": names.take(pa.array(group)),
                     "reason": pa.DictionaryArray.from_arrays(pa.array(reason[at]), ["eval", "exact", "near"])
                     .cast(pa.string()),
                     "matched": names.take(pa.array(matched)),
                     "similarity": pa.array(np.concatenate([e_sim, psim[dup]])[at], pa.float32())})
