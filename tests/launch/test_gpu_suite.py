"""benchmarks/gpu_suite.py always reports: a part stopped at its time limit keeps the figures it wrote so far, a failed
part keeps its exit code and output, and the suite's JSON is written as each part ends."""

import importlib.util
import json
import time
from pathlib import Path

ROOT = Path(__file__).parents[2]


def _suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", ROOT / "benchmarks" / "gpu_suite.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SLOW = """import json, sys, time
path = sys.argv[sys.argv.index("--json") + 1]
res = {"runs": []}
for i in range(100):
    res["runs"].append(i)
    json.dump(res, open(path, "w"))
    print("run", i, flush=True)
    time.sleep(0.2 if i < 2 else 30)
"""
FAIL = """import json, sys
json.dump({"build_s": 1.0}, open(sys.argv[sys.argv.index("--json") + 1], "w"))
sys.exit("boom: no such model")
"""
OK = """import json, sys
json.dump({"score": {"sentences_per_s": 5.0}}, open(sys.argv[sys.argv.index("--json") + 1], "w"))
"""


def test_a_stopped_part_keeps_its_figures_and_the_suite_its_json(tmp_path, monkeypatch):
    suite = _suite()
    for name, code in (("slow.py", SLOW), ("fail.py", FAIL), ("ok.py", OK)):
        (tmp_path / name).write_text(code)
    monkeypatch.setattr(suite, "HERE", tmp_path)
    monkeypatch.setattr(suite, "SMOKE", {"slow": (["slow.py"], 3), "fail": (["fail.py", "--x"], 60),
                                         "ok": (["ok.py"], 60), "late": (["ok.py"], 60)})
    monkeypatch.setattr(suite, "BUDGET", {"smoke": 3 + 60 + 60 + 10})
    monkeypatch.setattr(suite, "MIN_PART_S", 1)
    out = tmp_path / "res" / "suite.json"
    t = time.perf_counter()
    code = suite.main(["--smoke", "--out", str(out), "--only", "slow", "fail", "ok"])
    assert time.perf_counter() - t < 40  # the slow part was stopped, not waited for
    res = json.loads(out.read_text())
    slow, fail, ok = (res["parts"][k] for k in ("slow", "fail", "ok"))
    assert slow["stopped"] and slow["figures"]["runs"] == [0, 1, 2] and "run 2" in slow["stdout_tail"]
    assert not fail["stopped"] and fail["returncode"] == 1 and fail["figures"] == {"build_s": 1.0}
    assert "boom: no such model" in fail["stderr_tail"] and fail["command"].endswith("fail.py --x")
    assert ok["returncode"] == 0 and ok["figures"] == {"score": {"sentences_per_s": 5.0}}
    assert "late" not in res["parts"] and code == 1
    assert (tmp_path / "res" / "suite_parts" / "slow.json").exists()


def test_the_budget_skips_parts_that_would_not_fit(tmp_path, monkeypatch):
    suite = _suite()
    (tmp_path / "ok.py").write_text(OK)
    monkeypatch.setattr(suite, "HERE", tmp_path)
    monkeypatch.setattr(suite, "SMOKE", {"a": (["ok.py"], 60), "b": (["ok.py"], 60)})
    monkeypatch.setattr(suite, "BUDGET", {"smoke": 0.5})
    out = tmp_path / "s.json"
    assert suite.main(["--smoke", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["parts"] == {"a": {"skipped": "suite budget spent (0 s)"}, "b": {"skipped": "suite budget spent (0 s)"}}
