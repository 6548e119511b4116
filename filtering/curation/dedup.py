"""``halsift dedup``: exact and near duplicates of a corpus, and its leaks of evaluation images (docs/curation.md).

Passes: (1) one descriptor part per shard (:mod:`.hash_parts`, resumable); (2) exact groups from sorted hash
columns (DuckDB); (3) near pairs: phash within ``phash_distance`` bits confirmed by thumbnail cosine >=
``near_thumbnail`` (:func:`.search.hamming_pairs`), and with embeddings cosine >= ``cosine`` (clustered
:func:`.search.cosine_pairs`); (4) evaluation leaks: each corpus image's best match among the ``--against`` images
(thumbnail with crop variants >= ``eval_thumbnail``; embedding >= ``cosine``). Groups are connected components of
exact and near pairs; the first key in corpus order represents its group, every other member is listed; a leak is
listed with reason ``eval`` whatever its group.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from halsift.corpus.errors import InputError
from halsift.corpus.images import SkipCounter
from halsift.corpus.run_folder import check_or_start
from halsift.corpus.progress import progress
from halsift.corpus.scores import write_part_atomic
from halsift.corpus.shards import expand_shards, write_json_atomic
from halsift.filtering.curation import DUPLICATES
from halsift.filtering.curation.descriptors import THUMB_DIM, crop_variants, thumb_vectors, thumbnail
from halsift.filtering.curation.hash_parts import hash_shard, part_is_current, part_path, read_part
from halsift.filtering.curation.search import best_matches, cosine_pairs, hamming_pairs

EXACT, NEAR = 0, 1
MANIFEST = "manifest.json"
FORMAT = "halsift-dedup/1"


def _corpus_descriptors(shards: list[Path], out: Path, show: bool) -> tuple[pa.Table, SkipCounter, int]:
    parts_dir = out / "_parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    skipped, tables, reused = SkipCounter(), [], 0
    with progress(total=len(shards), desc="dedup: hash", unit="shard", disable=not show) as bar:
        for shard in shards:
            path = part_path(parts_dir, shard)
            if part_is_current(path, shard):
                reused += 1
            else:
                hash_shard(shard, path)
            t, sk = read_part(path)
            tables.append(t)
            skipped.merge(sk)
            bar.update()
            bar.set_postfix(samples=sum(len(x) for x in tables))
    from halsift.filtering.curation.hash_parts import SCHEMA

    return (pa.concat_tables(tables) if tables else SCHEMA.empty_table()), skipped, reused


def _exact_pairs(table: pa.Table, on: str) -> tuple[np.ndarray, np.ndarray]:
    """Each row whose hash (``on``: image, caption or pair) repeats an earlier row: ``(row, first row)``."""
    import duckdb
    import pyarrow.compute as pc

    img, cap = table.column("image_sha"), table.column("caption_sha")
    h = img if on == "image" else cap if on == "caption" else pc.binary_join_element_wise(img, cap, "")
    rel = pa.table({"h": h, "i": pa.array(np.arange(len(table), dtype=np.int64))})
    con = duckdb.connect()
    con.register("t", rel)
    res = con.execute("SELECT i, min(i) OVER (PARTITION BY h) AS r FROM t QUALIFY i > r").fetchnumpy()
    con.close()
    return res["i"].astype(np.int64), res["r"].astype(np.int64)


def _thumb_cos(thumbs: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if len(a) == 0:
        return np.empty(0, np.float32)
    return np.einsum("ij,ij->i", thumb_vectors(thumbs[a]), thumb_vectors(thumbs[b])).astype(np.float32)


def _groups(n: int, edges: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]]):
    """``(representative row of each row, chosen partner, similarity, reason code)`` over the edge lists."""
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    a = np.concatenate([e[0] for e in edges] + [np.empty(0, np.int64)])
    b = np.concatenate([e[1] for e in edges] + [np.empty(0, np.int64)])
    sim = np.concatenate([e[2] for e in edges] + [np.empty(0, np.float32)]).astype(np.float32)
    code = np.concatenate([np.full(len(e[0]), e[3], np.int8) for e in edges] + [np.empty(0, np.int8)])
    _, label = connected_components(coo_matrix((np.ones(len(a)), (a, b)), shape=(n, n)), directed=False)
    rep = np.full(label.max() + 1 if n else 0, n, np.int64)
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
    return rep_of, partner, psim, pcode


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


def _embedding_rows(folder: Path, row_of: dict[str, int]):
    """``(chunks factory, rows, dim, model)``: the store's image vectors of corpus keys, in store order."""
    from halsift.corpus.embedding_store import iter_embeddings, read_manifest

    manifest = read_manifest(folder)
    rows = []
    for e in iter_embeddings(folder):
        rows.append(np.fromiter((row_of.get(k, -1) for k in e.keys), np.int64, len(e.keys)))
    rows_all = np.concatenate(rows) if rows else np.empty(0, np.int64)

    def chunks():
        for e, r in zip(iter_embeddings(folder), rows):
            yield e.vectors[r >= 0].astype(np.float32)

    return chunks, rows_all[rows_all >= 0], int(manifest["dim"]), manifest["model"]


def run_dedup(data: str, out: str | Path, against: list[str] = (), embeddings: str | None = None,
              model: str | None = None, exact_on: str = "image", phash_distance: int = 4,
              near_thumbnail: float = 0.97, eval_thumbnail: float = 0.92, cosine: float = 0.95,
              nprobe: int = 8, show_progress: bool = True, engine: str = "local", **engine_flags) -> dict:
    """Write ``out/duplicates.parquet`` and ``out/manifest.json``; returns the manifest (module docstring).
    ``engine``/``engine_flags`` (``num_tasks``, ``task_index``, ``decode_workers`` ...): the per-shard part on the
    scoring engines (:func:`.hash_parts.shard_stage`); a task run writes its parts only and returns
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
    out.mkdir(parents=True, exist_ok=True)
    from halsift.filtering.curation.hash_parts import shard_stage

    staged = shard_stage(shards, out, model, show_progress, engine, **engine_flags)
    if staged is not None and staged[1]:
        return {"status": "parts", "complete": staged[0].complete, "lines": staged[0].lines, **staged[0].stats}
    timing: dict[str, float] = {}
    table, skipped, reused = _corpus_descriptors(shards, out, show_progress)
    timing["hash_s"] = time.time() - t0
    keys = table.column("key").to_pylist()
    n = len(keys)
    thumbs = np.frombuffer(b"".join(table.column("thumb").to_pylist()), np.uint8).reshape(n, THUMB_DIM) \
        if n else np.empty((0, THUMB_DIM), np.uint8)

    t = time.time()
    ea, eb = _exact_pairs(table, exact_on)
    edges = [(ea, eb, np.ones(len(ea), np.float32), EXACT)]
    hashes = np.frombuffer(b"".join(table.column("phash").to_pylist()), np.uint8).reshape(n, 8) if n else \
        np.empty((0, 8), np.uint8)
    with progress(total=n, desc="dedup: phash", unit="img", disable=not show_progress) as bar:
        pa_, pb, dist = hamming_pairs(hashes, phash_distance, bar)
    tc = _thumb_cos(thumbs, pa_, pb)
    ok = tc >= near_thumbnail
    edges.append((pa_[ok], pb[ok], tc[ok], NEAR))
    counts_near = {"phash_candidates": int(len(pa_)), "phash_confirmed": int(ok.sum())}
    timing["near_hash_s"] = time.time() - t

    encoder, model_name, emb_folder = None, None, None
    if model:
        from halsift.filtering.curation.encode import ImageEncoder, encode_corpus

        t = time.time()
        encoder = ImageEncoder(model)
        emb_folder = out / "embeddings"
        with progress(total=len(shards), desc="dedup: encode", unit="shard", disable=not show_progress) as bar:
            encode_corpus(shards, emb_folder, encoder, bar)
        timing["encode_s"] = time.time() - t
    elif embeddings:
        from halsift.corpus.embedding_store import check_embedded_from

        emb_folder = Path(embeddings)
        check_embedded_from(emb_folder, shards)  # vectors of the shards' content now, or one line
    row_of = {}
    for i, k in enumerate(keys):
        row_of.setdefault(k, i)
    emb_rows = None
    if emb_folder is not None:
        t = time.time()
        chunks, emb_rows, dim, model_name = _embedding_rows(emb_folder, row_of)
        with progress(total=len(emb_rows), desc="dedup: semantic", unit="img", disable=not show_progress) as bar:
            sa, sb, ss = cosine_pairs(chunks, len(emb_rows), dim, cosine, nprobe=nprobe, bar=bar)
        a2, b2 = emb_rows[sa], emb_rows[sb]
        edges.append((np.minimum(a2, b2), np.maximum(a2, b2), ss, NEAR))
        counts_near["embedding_pairs"] = int(len(sa))
        timing["near_embedding_s"] = time.time() - t

    leak_row, leak_ref, leak_sim = np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)
    refs, against_skipped = None, SkipCounter()
    if against:
        t = time.time()
        if encoder is None and emb_folder is not None:
            from halsift.filtering.curation.encode import ImageEncoder

            encoder = ImageEncoder(model_name)  # the store's model encodes the (small) evaluation side
        refs, against_skipped = _against_refs(list(against), encoder, show_progress)
        with progress(total=n, desc="dedup: eval", unit="img", disable=not show_progress) as bar:
            tv = (thumb_vectors(thumbs[s:s + 16384]) for s in range(0, n, 16384))
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

    rows = _rows(n, keys, edges, leak_row, leak_ref, leak_sim, refs["ids"] if refs else [])
    write_part_atomic(rows, out / DUPLICATES)
    reasons = rows.column("reason").to_pylist()
    manifest = {
        "format": FORMAT, "data": str(data), "shards": len(shards), "shards_reused": reused,
        "samples": n, "skipped": skipped.to_json(),
        "against": [{"path": str(a), "images": c} for a, c in zip(against, refs["per_set"] if refs else [])],
        "against_skipped": against_skipped.to_json(),
        "embeddings": str(emb_folder) if emb_folder else None, "model": model_name,
        "thresholds": {"exact_on": exact_on, "phash_distance": phash_distance, "near_thumbnail": near_thumbnail,
                       "eval_thumbnail": eval_thumbnail, "cosine": cosine if emb_folder else None,
                       "nprobe": nprobe},
        "counts": {r: reasons.count(r) for r in ("exact", "near", "eval")}, "removed": len(reasons),
        "groups": int(len(set(rows.column("group").to_pylist()))) if len(reasons) else 0,
        "pairs": {"exact": int(len(ea)), **counts_near},
        "timing_s": {k: round(v, 3) for k, v in {**timing, "total_s": time.time() - t0}.items()},
    }
    write_json_atomic(out / MANIFEST, manifest)
    return manifest


def _rows(n: int, keys: list[str], edges, leak_row, leak_ref, leak_sim, ref_ids: list[str]) -> pa.Table:
    """duplicates.parquet: eval rows (best match per corpus row), then the non-representative group members."""
    best = {}
    for r, o, s in zip(leak_row.tolist(), leak_ref.tolist(), leak_sim.tolist()):
        if r not in best or s > best[r][1]:
            best[r] = (o, s)
    out = {"key": [], "group": [], "reason": [], "matched": [], "similarity": []}
    rep_of, partner, psim, pcode = _groups(n, edges) if n else (np.empty(0, np.int64),) * 4
    for i in range(n):
        if i in best:
            o, s = best[i]
            out["key"].append(keys[i]), out["group"].append(ref_ids[o]), out["reason"].append("eval")
            out["matched"].append(ref_ids[o]), out["similarity"].append(s)
        elif rep_of[i] != i:
            out["key"].append(keys[i]), out["group"].append(keys[rep_of[i]])
            out["reason"].append("exact" if pcode[i] == EXACT else "near")
            out["matched"].append(keys[partner[i]]), out["similarity"].append(float(psim[i]))
    return pa.table({"key": pa.array(out["key"], pa.string()), "group": pa.array(out["group"], pa.string()),
                     "reason": pa.array(out["reason"], pa.string()),
                     "matched": pa.array(out["matched"], pa.string()),
                     "similarity": pa.array(out["similarity"], pa.float32())})
