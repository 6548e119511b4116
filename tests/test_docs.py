"""The docs hold together: every relative link in README.md and docs/ reaches a file (and a heading, for a
``#fragment``), and the README stays a two-minute read (issue 40): the two set-up commands first, at most 900
words, tour rows of at most 160 characters."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
COMMANDS = ["pip install -e . && halsift run quickstart", "pip install -e '.[test]' && python -m pytest -q"]
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"(?ms)^```.*?^```")


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def broken_links(doc: Path) -> list[str]:
    """The relative links of ``doc`` whose file or heading does not exist, as ``target (why)``."""
    bad = []
    for target in _LINK.findall(_FENCE.sub("", doc.read_text())):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        dest = (doc.parent / path).resolve() if path else doc
        if not dest.exists():
            bad.append(f"{target} (no such file)")
        elif fragment and dest.suffix == ".md":
            heads = {_slug(h) for h in re.findall(r"(?m)^#+ (.+)$", _FENCE.sub("", dest.read_text()))}
            if fragment not in heads:
                bad.append(f"{target} (no such heading)")
        elif "shared" in Path(path).parts:
            bad.append(f"{target} (outside the repository)")
    return bad


def test_every_doc_link_reaches_its_file_and_heading():
    bad = {str(d.relative_to(ROOT)): b for d in DOCS if (b := broken_links(d))}
    assert not bad, f"broken links: {bad}"


def test_the_link_check_sees_a_broken_link(tmp_path):
    (tmp_path / "b.md").write_text("# Real heading\n")
    doc = tmp_path / "a.md"
    doc.write_text("[ok](b.md) [ok](b.md#real-heading) [x](c.md) [y](b.md#nope) [web](https://x.org/c.md)\n"
                   "```\n[in code](d.md)\n```\n")
    assert broken_links(doc) == ["c.md (no such file)", "b.md#nope (no such heading)"]


def test_readme_is_short_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    words = len(text.split())
    assert words <= 900, f"README.md has {words} words (at most 900: move detail to docs/)"
    blocks = re.findall(r"(?ms)^```bash\n(.*?)\n```", text)
    assert blocks[:2] == COMMANDS, "README.md must open with the two set-up commands, byte-identical"
    long_rows = [row[:60] for row in text.splitlines() if row.startswith("|") and len(row) > 160]
    assert not long_rows, f"README.md table rows over 160 characters: {long_rows}"
