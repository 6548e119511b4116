"""The shared JSON/JSONL readers: blank lines skipped, errors name file:line and the expected shape."""

import pytest

from halsift.corpus.jsonl import iter_jsonl, read_json


class Bad(ValueError):
    pass


def test_iter_jsonl_skips_blank_lines_and_names_the_bad_line(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text('{"a": 1}\n\n  \n[2]\n{"b": \n')
    it = iter_jsonl(p, Bad)
    assert next(it) == (f"{p}:1", 1, {"a": 1})
    assert next(it) == (f"{p}:4", 4, [2])
    with pytest.raises(Bad, match=rf"^{p}:5: not valid JSON"):
        next(it)


def test_read_json_checks_the_top_level(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("[1, 2]")
    assert read_json(p, Bad, "vigil annotations", expect=list) == [1, 2]
    with pytest.raises(Bad, match=r"expected a JSON object at the top level \(results\), got list"):
        read_json(p, Bad, "results")
    p.write_text("{")
    with pytest.raises(Bad, match=rf"^{p}: not valid JSON"):
        read_json(p, Bad)
    with pytest.raises(FileNotFoundError, match="results: .*missing.json does not exist"):
        read_json(tmp_path / "missing.json", Bad, "results")
