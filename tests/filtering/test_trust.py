"""Issue 35, trust: ``trust_remote_code`` and ``api_key_env`` come only from the user's own spec (the command line,
their recipe's own text, their Python code), never from a file that a detector loads (a YAML spec file, an adapter
folder's detector.yaml, at any depth); option keys are normalized (spaces, case, ``-``) before the rule applies."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from loopback import LoopbackServer
from filtering_data import make_corpus, remote_code_model

from halsift.filtering.detectors.base import Detector, Result
from halsift.filtering.detectors.spec import SpecError, load_detector
from halsift.filtering.scoring.job import ScoreJob
from halsift.launch.cli import main


class Probe(Detector):
    """A detector family without a model that records the options it was built with."""

    family = "probe"
    calls: list[dict] = []

    def __init__(self, model: str = "", trust_remote_code: bool = False, api_key_env: str = "OPENAI_API_KEY") -> None:
        super().__init__()
        Probe.calls.append({"model": model, "trust_remote_code": trust_remote_code, "api_key_env": api_key_env})

    def score_batch(self, items):
        return [Result(50.0) for _ in items]


@pytest.fixture
def probe():
    """The ``probe`` family registered for one test; yields the list of option dicts it was built with."""
    from halsift.filtering.detectors import spec

    spec.register_family("probe", Probe)
    Probe.calls.clear()
    yield Probe.calls
    spec._REGISTRY.pop("probe", None)
    for key in [k for k in spec._CONFIGS if k[0] == "probe"]:
        del spec._CONFIGS[key]


@pytest.fixture(scope="module")
def transformers_log():
    """transformers' log handler is bound to the session's stderr by conftest.py (not to a test's capsys stream)."""


def _evil_model(root: Path) -> tuple[Path, Path]:
    """A model folder whose config needs remote code: importing its configuration_evil.py writes the marker."""
    marker = root / "pwned"
    return remote_code_model(root / "evil_model", marker), marker


def _adapter(root: Path, base: str, kind: str = "vlm") -> Path:
    """An adapter folder (no weights: ``adapter: false``) whose detector.yaml has ``base``."""
    folder = root / "adapter"
    folder.mkdir(parents=True)
    (folder / "detector.yaml").write_text(yaml.safe_dump({"kind": kind, "base": base, "adapter": False}))
    return folder


def _score(data, out, detector) -> int:
    return main(["score", "--detector", detector, "--data", str(data), "--out", str(out), "--no-progress"])


def _last_err(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err)
    return err[-1]


# ------------------------------------------------------------------------------- the cases, real models
def test_adapter_whose_base_is_an_ensemble_cannot_run_model_code(transformers_log, tmp_path, capsys):
    model, marker = _evil_model(tmp_path)
    adapter = _adapter(tmp_path, f"ensemble:members=[vlm:model={model},trust_remote_code=true]")
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    with pytest.warns(UserWarning, match=r"detector\.yaml: trust_remote_code ignored"):
        code = _score(data, tmp_path / "s", f"lora:{adapter}")
    assert not marker.exists()
    assert code == 2 and _last_err(capsys).startswith("halsift score: error:")


def test_yaml_spec_file_cannot_run_model_code(transformers_log, tmp_path, capsys):
    model, marker = _evil_model(tmp_path)
    spec = tmp_path / "judge.yaml"
    spec.write_text(f"family: vlm\nmodel: {model}\ntrust_remote_code: true\n")
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    with pytest.warns(UserWarning, match=r"judge\.yaml: trust_remote_code ignored"):
        code = _score(data, tmp_path / "s", str(spec))
    assert not marker.exists()
    assert code == 2 and _last_err(capsys).startswith("halsift score: error:")


def test_spaced_api_key_env_in_a_spec_file_sends_no_secret(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HALSIFT_TEST_SECRET", "sk-secret")
    server = LoopbackServer()
    try:
        spec = tmp_path / "shared.yaml"
        spec.write_text(yaml.safe_dump({"family": "ensemble", "members": [
            f"api:base_url={server.url}/v1,model=j,mode=prompt,max_retries=0,api_key_env =HALSIFT_TEST_SECRET",
            "random:seed=0"]}))
        data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
        code = _score(data, tmp_path / "s", str(spec))
        assert "Bearer sk-secret" not in server.auths and server.auths == []
        assert code == 2
        line = _last_err(capsys)
        assert "shared.yaml" in line and "api_key_env='HALSIFT_TEST_SECRET'" in line
    finally:
        server.close()


# ------------------------------------------------------------------------------- variants (a model-less family)
@pytest.mark.parametrize("key", ["trust_remote_code", " trust_remote_code", "TRUST_REMOTE_CODE", "trust-remote-code",
                                 "Trust-Remote-Code "])
def test_nested_ensembles_in_an_adapter_base_cannot_turn_it_on(probe, tmp_path, key):
    inner = f"ensemble:members=[probe:model=a,{key}=true;random:seed=0]"
    adapter = _adapter(tmp_path, f"ensemble:members=[{inner};random:seed=1]")
    with pytest.warns(UserWarning, match=r"detector\.yaml: trust_remote_code ignored"), \
            pytest.raises(SpecError, match="kind 'vlm' but base"):  # an ensemble is no vlm base: refused after
        load_detector(f"lora:{adapter}")
    assert probe == [{"model": "a", "trust_remote_code": False, "api_key_env": "OPENAI_API_KEY"}]


def test_the_users_own_lora_grant_reaches_every_model_the_adapter_loads(probe, tmp_path):
    adapter = _adapter(tmp_path, "ensemble:members=[ensemble:members=[probe:model=a;random];random]")
    with pytest.raises(SpecError, match="kind 'vlm' but base"):
        load_detector(f"lora:{adapter},Trust-Remote-Code=true")
    with pytest.raises(SpecError, match="kind 'vlm' but base"):
        load_detector(f"lora:{adapter}")
    assert [c["trust_remote_code"] for c in probe] == [True, False]


def test_a_file_cannot_grant_itself_through_a_lora_spec(probe, tmp_path):
    adapter = _adapter(tmp_path, "ensemble:members=[probe:model=a;random]")
    spec = tmp_path / "shared.yaml"
    spec.write_text(yaml.safe_dump({"family": "ensemble", "members": [f"lora:{adapter},trust_remote_code=true",
                                                                      "random"]}))
    with pytest.warns(UserWarning, match=r"shared\.yaml: trust_remote_code ignored"), \
            pytest.raises(SpecError, match="kind 'vlm' but base"):
        load_detector(spec)
    assert probe[0]["trust_remote_code"] is False


@pytest.mark.parametrize("key", ["trust_remote_code", "Trust-Remote-Code", " TRUST_REMOTE_CODE "])
def test_yaml_spec_files_at_any_depth_cannot_turn_it_on(probe, tmp_path, key):
    inner = tmp_path / "inner.yaml"
    inner.write_text(yaml.safe_dump({"family": "probe", "model": "m", key: True}))
    outer = tmp_path / "outer.yaml"
    outer.write_text(yaml.safe_dump({"family": "ensemble", "members": [str(inner), {"family": "random"}]}))
    with pytest.warns(UserWarning, match=r"inner\.yaml: trust_remote_code ignored"):
        det = load_detector(outer)
    assert probe == [{"model": "m", "trust_remote_code": False, "api_key_env": "OPENAI_API_KEY"}]
    assert "trust_remote_code" not in det.spec  # nor in the canonical spec a worker would reload


def test_the_users_own_spec_normalizes_keys_the_same_way(probe):
    load_detector("probe:model=a, Trust-Remote-Code =true,API-KEY-ENV=MY_KEY")
    assert probe == [{"model": "a", "trust_remote_code": True, "api_key_env": "MY_KEY"}]
    with pytest.raises(SpecError, match="'trust_remote_code' given twice"):
        load_detector("probe:trust_remote_code=false,TRUST_REMOTE_CODE=true")
    with pytest.raises(SpecError, match="'api_key_env' given twice"):
        load_detector({"family": "probe", "api_key_env": "A", "Api-Key-Env": "B"})


def _spec_file(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("data", [
    {"family": "probe", "API-KEY-ENV": "SECRET"},
    {"family": "probe", " api_key_env ": "SECRET"},
    {"family": "ensemble", "members": ["probe:model=a,api_key_env =SECRET", "random"]},
    {"family": "ensemble", "members": ["ensemble:members=[random;probe:Api_Key_Env=SECRET]"]},
    {"family": "ensemble", "members": [{"family": "ensemble", "members": [{"family": "probe", "api-key-env": "SECRET"},
                                                                        "random"]}, "random"]},
], ids=["hyphen-upper", "spaces", "space-before-=", "mixed-case-member", "nested-dict"])
def test_api_key_env_in_a_spec_file_is_refused_in_every_spelling(probe, tmp_path, data):
    path = _spec_file(tmp_path, data)
    with pytest.raises(SpecError, match=rf"{path}: api_key_env='SECRET' is refused"):
        load_detector(path)
    assert all(c["api_key_env"] != "SECRET" for c in probe)


def test_api_key_env_in_an_adapter_base_is_refused(probe, tmp_path):
    adapter = _adapter(tmp_path, "ensemble:members=[ensemble:members=[random;probe:api_key_env =SECRET];random]")
    with pytest.raises(SpecError, match=r"detector\.yaml: api_key_env='SECRET' is refused"):
        load_detector(f"lora:{adapter}")
    assert probe == []


def test_a_spec_file_may_name_the_default_key_variable(probe, tmp_path):
    load_detector(_spec_file(tmp_path, {"family": "probe", "api_key_env": "OPENAI_API_KEY"}))
    assert probe[0]["api_key_env"] == "OPENAI_API_KEY"


def test_the_notebook_api_applies_the_same_rule(probe, tmp_path):
    import halsift

    with pytest.raises(SpecError, match="api_key_env='SECRET' is refused"):
        halsift.load_detector(str(_spec_file(tmp_path, {"family": "probe", "Api-Key-Env": "SECRET"})))
    halsift.load_detector({"family": "probe", "Trust-Remote-Code": True})  # the user's own code: theirs to grant
    assert probe == [{"model": "", "trust_remote_code": True, "api_key_env": "OPENAI_API_KEY"}]


def test_ray_actors_reload_the_spec_the_user_gave_not_its_canonical_string(probe, tmp_path, monkeypatch):
    """A file's option value that holds ``,trust_remote_code=true`` must not become an option when the Ray actors
    rebuild the detector (they used to re-parse the canonical spec string as if the user had typed it)."""
    from halsift.execution import engines

    class Stop(Exception):
        pass

    sent = []

    class FakeRay:
        def is_initialized(self):
            return True

        def cluster_resources(self):
            return {"CPU": 1}

        def remote(self, **_):
            class Actor:
                @staticmethod
                def remote(factory, *rest):
                    sent.append(factory)
                    raise Stop

            return lambda cls: Actor

    monkeypatch.setattr(engines, "ray_module", FakeRay)
    spec = _spec_file(tmp_path, {"family": "probe", "model": "x,trust_remote_code=true"})
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    with pytest.raises(Stop, match="^$"):  # the fake actor stops the run once it has the spec
        engines.ENGINES["ray"].run(ScoreJob(str(spec), data, tmp_path / "s", device="cpu", workers=1,
                                            show_progress=False))
    probe.clear()
    sent[0](0, 1).close()  # the maker an actor builds from what it is sent
    assert probe == [{"model": "x,trust_remote_code=true", "trust_remote_code": False,
                      "api_key_env": "OPENAI_API_KEY"}]
