"""``halsift annotate``'s page: a static HTML file (opens from disk, no server) where a person marks each drawn
sentence correct or hallucinated with the keyboard, and exports the labels as a bench JSONL.

Keys: ``j`` / ``k`` next / previous sentence, ``y`` or ``1`` correct, ``n`` or ``0`` hallucinated, ``u`` clear;
clicking words of the current sentence marks them as the hallucinated span (optional). The labels live in the
browser's localStorage (a reload keeps them) until ``Export`` downloads ``labels.jsonl``: the drawn bench rows with
their labels (and spans), the rows not yet labelled left out. Saved beside the page (its images are in
``images/``), that file is a bench ``halsift score`` and ``select --calibration`` read.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from halsift.corpus.atomic import atomic_file
from halsift.eval.report.html import script_json

PAGE = "index.html"

_HTML = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>halsift annotate</title>
<style>
body{font:15px/1.4 system-ui,sans-serif;margin:0;display:flex;height:100vh}
#side{width:280px;overflow:auto;border-right:1px solid #ccc;padding:8px;font-size:12px}
#main{flex:1;padding:16px;overflow:auto}
#main img{max-width:480px;max-height:420px;display:block;margin-bottom:12px}
.ctx{color:#888}.w{cursor:pointer;padding:0 1px}.w.span{background:#f99;text-decoration:line-through}
.target{font-size:20px;background:#ffd;padding:6px}
.row{cursor:pointer;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
.row.cur{outline:2px solid #36c}.row.correct{color:#080}.row.incorrect{color:#c00}
#status{margin:10px 0;font-weight:bold}
kbd{border:1px solid #aaa;border-radius:3px;padding:0 4px;font-size:12px}
</style></head><body>
<div id="side"><div id="count"></div><button id="export">Export labels.jsonl</button><div id="list"></div></div>
<div id="main"><p><kbd>j</kbd>/<kbd>k</kbd> next/previous &nbsp; <kbd>y</kbd>/<kbd>1</kbd> correct &nbsp;
<kbd>n</kbd>/<kbd>0</kbd> hallucinated &nbsp; <kbd>u</kbd> clear &nbsp; click words: the hallucinated span
(optional) &nbsp; Export, then save labels.jsonl beside this page</p>
<img id="img" alt=""><div id="caption"></div><div id="status"></div></div>
<script id="data" type="application/json">__DATA__</script>
<script>
const D = JSON.parse(document.getElementById('data').textContent);
const KEY = 'halsift-annotate:' + D.id;
let L = JSON.parse(localStorage.getItem(KEY) || '{}');  // row id -> {label, words: [word indices]}
let cur = 0;
function save() { localStorage.setItem(KEY, JSON.stringify(L)); }
function words(s) { return s.split(/\\s+/).filter(x => x.length); }
function spans(ws) {  // word indices -> [start, end) runs
  const out = []; [...ws].sort((a, b) => a - b).forEach(i => {
    const last = out[out.length - 1]; if (last && last[1] === i) last[1] = i + 1; else out.push([i, i + 1]); });
  return out;
}
function render() {
  const r = D.rows[cur], lab = L[r.id] || {};
  document.getElementById('img').src = r.image;
  const cap = document.getElementById('caption'); cap.textContent = '';
  r.context.forEach((t, i) => {
    if (i === r.position) {
      const d = document.createElement('div'); d.className = 'target';
      words(r.sentence).forEach((w, j) => {
        const s = document.createElement('span'); s.className = 'w' + ((lab.words || []).includes(j) ? ' span' : '');
        s.textContent = w + ' '; s.dataset.word = j; s.onclick = () => toggleWord(j); d.appendChild(s); });
      cap.appendChild(d);
    } else { const d = document.createElement('div'); d.className = 'ctx'; d.textContent = t; cap.appendChild(d); }
  });
  document.getElementById('status').textContent =
    (cur + 1) + ' / ' + D.rows.length + ': ' + (lab.label === 'incorrect' ? 'hallucinated' : lab.label || 'not marked');
  const n = D.rows.filter(x => L[x.id] && L[x.id].label).length;
  const c = document.getElementById('count'); c.textContent = n + ' of ' + D.rows.length + ' marked';
  c.dataset.marked = n;
  document.querySelectorAll('.row').forEach((e, i) => {
    const l = (L[D.rows[i].id] || {}).label; e.className = 'row' + (i === cur ? ' cur' : '') + (l ? ' ' + l : ''); });
  const e = document.querySelectorAll('.row')[cur]; if (e) e.scrollIntoView({block: 'nearest'});
}
function toggleWord(j) {
  const id = D.rows[cur].id, lab = L[id] || (L[id] = {}); const ws = new Set(lab.words || []);
  ws.has(j) ? ws.delete(j) : ws.add(j); lab.words = [...ws];
  if (ws.size) lab.label = 'incorrect'; save(); render();
}
function mark(label) {
  const id = D.rows[cur].id;
  if (label === null) delete L[id]; else { L[id] = L[id] || {}; L[id].label = label; if (label === 'correct') L[id].words = []; }
  save(); if (label !== null && cur < D.rows.length - 1) cur++; render();
}
function exportText() {
  return D.rows.filter(r => L[r.id] && L[r.id].label).map(r => {
    const o = Object.assign({}, r.row); o.label = L[r.id].label;
    o.spans = o.label === 'incorrect' ? spans(L[r.id].words || []) : []; return JSON.stringify(o); }).join('\\n') + '\\n';
}
window.halsiftExport = exportText;
document.getElementById('export').onclick = () => {
  const a = document.createElement('a');
  a.href = URL.createObjectURL(new Blob([exportText()], {type: 'application/jsonl'}));
  a.download = 'labels.jsonl'; document.body.appendChild(a); a.click(); a.remove();
};
document.addEventListener('keydown', ev => {
  if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
  const k = ev.key;
  if (k === 'j') { cur = Math.min(cur + 1, D.rows.length - 1); render(); }
  else if (k === 'k') { cur = Math.max(cur - 1, 0); render(); }
  else if (k === 'y' || k === '1') mark('correct');
  else if (k === 'n' || k === '0') mark('incorrect');
  else if (k === 'u') mark(null);
});
const list = document.getElementById('list');
D.rows.forEach((r, i) => { const d = document.createElement('div'); d.className = 'row'; d.textContent = r.sentence;
  d.onclick = () => { cur = i; render(); }; list.appendChild(d); });
render();
</script></body></html>
"""


def write_annotate_page(out_dir: str | os.PathLike, rows: list[dict]) -> Path:
    """Write ``out_dir/index.html`` for the bench ``rows`` (each: the bench row to export, without its label,
    plus the caption's sentences as ``context``); returns its path."""
    items = [{"id": r["id"], "image": r["image"], "sentence": r["sentence"], "position": r["position"],
              "context": r.pop("_context"), "row": r} for r in rows]
    ident = hashlib.blake2b("\n".join(r["id"] for r in rows).encode(), digest_size=8).hexdigest()
    html = _HTML.replace("__DATA__", script_json({"id": ident, "rows": items}))
    path = Path(out_dir) / PAGE
    with atomic_file(path) as tmp:
        Path(tmp).write_text(html, encoding="utf-8")
    return path
