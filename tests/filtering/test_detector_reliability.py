"""Regression tests from the reliability probes (issues 19 and 35), by stage: Detectors: a loaded folder never raises
privileges, api credentials stay at base_url, bad weights and spec files are one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from loopback import LoopbackServer
from cli_cases import _alias_bomb, _err_line, _score
from filtering_data import make_corpus, remote_code_model



# ------------------------------------------------------------------------------- 6. a loaded folder never raises privileges
def _evil_adapter(root: Path) -> tuple[Path, Path]:
    """An adapter folder whose detector.yaml turns trust_remote_code on for a base model inside the folder, whose
    configuration_*.py would write a marker file when imported."""
    marker = root / "pwned"
    remote_code_model(root / "adapter" / "base", marker)
    (root / "adapter" / "detector.yaml").write_text(
        "kind: vlm\nbase: vlm:model=./base,trust_remote_code=true\nadapter: false\n")
    return root / "adapter", marker


def test_adapter_folder_cannot_turn_on_trust_remote_code(tmp_path, capsys):
    adapter, marker = _evil_adapter(tmp_path)
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    with pytest.warns(UserWarning, match="trust_remote_code"):
        code = _score(data, tmp_path / "s", f"lora:{adapter}")
    assert not marker.exists()
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("halsift score: error: detector spec") and "Traceback" not in "\n".join(err)
    assert not list((tmp_path / "s").glob("part-*"))
    # the folder's code runs only when the user asks for it on the command line (the test's folder is live)
    _score(data, tmp_path / "s2", f"lora:path={adapter},trust_remote_code=true")
    assert marker.read_text() == "ran"


# ------------------------------------------------------------------------------- 7. api credentials stay at base_url
def test_api_detector_refuses_a_redirect_and_never_sends_the_key_elsewhere(tmp_path, monkeypatch, capsys):
    other = LoopbackServer()  # another origin (another port), answering score 99

    def redirect(h):
        h.send_response(302)  # urllib followed it as a GET to the other host, key included
        h.send_header("Location", other.url + "/steal")
        h.send_header("Content-Length", "0")
        h.end_headers()

    server = LoopbackServer(redirect)
    try:
        monkeypatch.setenv("HALSIFT_TEST_KEY", "sk-secret")
        data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
        spec = f"api:base_url={server.url}/v1,model=judge,api_key_env=HALSIFT_TEST_KEY,mode=prompt,max_retries=0"
        assert _score(data, tmp_path / "s", spec) == 2
        line = _err_line(capsys)
        assert "redirect" in line and "/steal" in line
        assert server.requests and server.requests[0]["auth"] == "Bearer sk-secret"
        assert other.requests == []
        assert not list((tmp_path / "s").glob("part-*"))
    finally:
        server.close()
        other.close()


def test_api_key_variable_cannot_be_chosen_by_a_spec_file(tmp_path, capsys):
    spec = tmp_path / "judge.yaml"
    spec.write_text("family: api\nbase_url: http://127.0.0.1:9/v1\nmodel: judge\napi_key_env: HOME\n")
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    assert _score(data, tmp_path / "s", str(spec)) == 2
    line = _err_line(capsys)
    assert "api_key_env='HOME'" in line and "judge.yaml" in line
    spec.write_text("family: ensemble\nmembers: ['api:base_url=http://127.0.0.1:9/v1,model=j,api_key_env=PATH', "
                    "'random:seed=0']\n")
    assert _score(data, tmp_path / "s", str(spec)) == 2
    assert "api_key_env='PATH'" in _err_line(capsys)


def test_clip_checkpoint_loads_without_the_random_init_warning_and_garbage_is_one_line(tmp_path, caplog, capsys):
    import logging

    from halsift.filtering.detectors.clip import ClipDetector
    from halsift.training.clip_train import save_state_dict_safetensors

    ckpt = tmp_path / "model.safetensors"
    save_state_dict_safetensors(ClipDetector(arch="halsift-tiny", pretrained="random", seed=3).model, ckpt)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        ClipDetector(arch="halsift-tiny", checkpoint=str(ckpt))
    assert "No pretrained weights loaded" not in caplog.text
    with caplog.at_level(logging.WARNING):
        ClipDetector(arch="halsift-tiny", pretrained="random")  # a random init still says so
    assert "No pretrained weights loaded" in caplog.text
    ckpt.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    assert _score(data, tmp_path / "s", f"clip:arch=halsift-tiny,checkpoint={ckpt}") == 2
    line = _err_line(capsys)
    assert str(ckpt) in line and "not a valid safetensors file" in line


def test_detector_spec_file_alias_bomb_is_one_short_line(tmp_path, capsys):
    levels = _alias_bomb(keys=True)
    spec = tmp_path / "det.yaml"
    spec.write_text("family: random\n" + "\n".join(levels) + "\n")
    data = make_corpus(tmp_path / "c", shards=1, per_shard=2)
    assert _score(data, tmp_path / "s", str(spec)) == 2
    line = _err_line(capsys)
    assert "det.yaml" in line and "alias" in line and len(line) < 600
