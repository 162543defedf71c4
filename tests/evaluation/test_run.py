"""The evaluate command end to end in one process: the outputs exist, parse and agree; bad input fails clearly."""

import csv
import json
import os
from pathlib import Path
from unittest import mock

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def _main(argv):
    """main() of the entry script, loaded by path (it is a script, not a module of the package). The environment
    variables it sets for its process (quiet_libraries) are undone after: processes later tests start inherit
    this one's environment."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("evaluate_entry", REPO / "pipeline" / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with mock.patch.dict(os.environ):
        return module.main(argv)


def _read_jsonl(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_outputs_exist_parse_and_agree(world, capsys):
    assert _main(["--config", str(world.config_path), "--split", "test", "--quiet", "eval.batch_size=4"]) == 0
    out = world.run_dir / "eval" / "test-final"
    metrics = json.loads((out / "metrics.json").read_text())
    preds = _read_jsonl(out / "predictions.jsonl")
    docs = _read_jsonl(out / "documents.jsonl")
    # one row per example, in split order, with the planted labels
    assert [(p["id"], p["chunk"]) for p in preds] == [(r[0], r[1]) for r in world.test_rows]
    assert [p["label"] for p in preds] == [world.label_names[r[2]] for r in world.test_rows]
    assert all(abs(sum(p["probabilities"].values()) - 1) < 1e-4 for p in preds)
    assert all(p["prediction"] == max(p["probabilities"], key=p["probabilities"].get) for p in preds)
    # metrics.json agrees with the predictions it came from
    accuracy = np.mean([p["label"] == p["prediction"] for p in preds])
    assert metrics["chunk"]["accuracy"] == pytest.approx(accuracy)
    assert metrics["chunk"]["examples"] == 13 and metrics["document"]["examples"] == 10
    assert {d["id"]: d["chunks"] for d in docs}["long"] == 3 and "text" not in docs[0]
    assert preds[0]["text"] == world.test_rows[0][3]  # shorter than eval.snippet_chars: whole
    assert metrics["document"]["accuracy"] == pytest.approx(np.mean([d["label"] == d["prediction"] for d in docs]))
    assert sum(v["support"] for v in metrics["chunk"]["per_class"].values()) == 13
    # confusion matrix CSV = the one in metrics.json; the PNGs are PNGs
    rows = list(csv.reader((out / "confusion_matrix.csv").open()))
    assert rows[0][1:] == world.label_names
    assert [[int(v) for v in r[1:]] for r in rows[1:]] == metrics["chunk"]["confusion_matrix"]
    for png in ("confusion_matrix.png", "confusion_matrix_documents.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # TensorBoard has the scalars
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    scalar = events.Scalars("eval_test/chunk/accuracy")[0]
    assert scalar.value == pytest.approx(accuracy) and scalar.step == 0
    table = capsys.readouterr().out
    assert "accuracy" in table and "macro F1" in table and str(out) in table


def test_a_named_checkpoint_gets_its_own_folder_and_step_and_bf16_runs(world, capsys):
    from pipeline.accel import cpu_has_native_bf16

    argv = ["--config", str(world.config_path), "--checkpoint", "best", "--split", "validation", "--quiet", "--bf16"]
    assert _main(argv) == 0
    metrics = json.loads((world.run_dir / "eval" / "validation-best" / "metrics.json").read_text())
    assert metrics["checkpoint_path"].endswith("step-4") and metrics["step"] == 4
    assert metrics["chunk"]["examples"] == 5 and metrics["bf16"] is True and metrics["precision"] == "bf16"
    err = capsys.readouterr().err
    assert "--bf16 is deprecated" in err  # the old flag still works, and says what to write instead
    assert ("WARNING: eval.precision=bf16" in err) is not cpu_has_native_bf16()  # the product's own detection decides
    assert "other prepared data" not in err  # step-4 was trained on this data


def test_unknown_split_lists_the_available_ones(world):
    with pytest.raises(ValueError, match="split 'dev'.*available: train, validation, test"):
        _main(["--config", str(world.config_path), "--split", "dev"])


def test_label_set_of_the_data_differs_from_the_checkpoint(tmp_path, make_world):
    other = make_world(tmp_path, data_labels=["neg", "neu", "pos"])
    with pytest.raises(ValueError, match=r"label mismatch.*'negative', 'neutral', 'positive'.*'neg', 'neu', 'pos'"):
        _main(["--config", str(other.config_path), "--quiet"])


def test_bad_input_is_one_line_on_stderr_and_exit_code_2(world, capsys, monkeypatch):
    """evaluate.py's main under run_main, as its process runs it (in this one)."""
    from pipeline.cli import run_main

    monkeypatch.delenv("PIPELINE_DEBUG", raising=False)
    capsys.readouterr()
    with pytest.raises(SystemExit) as ended:
        run_main(lambda _: _main(["--config", str(world.config_path), "--checkpoint", "nope"]))
    err = capsys.readouterr().err
    assert ended.value.code == 2
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("error: checkpoint 'nope' not found")


def test_a_checkpoint_trained_on_other_data_is_flagged(world, capsys):
    assert _main(["--config", str(world.config_path), "--checkpoint", "last", "--quiet"]) == 0  # step-8: other data
    metrics = json.loads((world.run_dir / "eval" / "test-last" / "metrics.json").read_text())
    assert metrics["training_data_fingerprint"] == "other-data" and metrics["data_fingerprint"] == "test"
    assert "trained on other prepared data (fingerprint other-data)" in capsys.readouterr().err


def test_int8_evaluation_says_its_precision_and_attention(world, capsys):
    argv = ["--config", str(world.config_path), "--split", "test", "--quiet", "--precision", "int8"]
    assert _main(argv) == 0
    metrics = json.loads((world.run_dir / "eval" / "test-final" / "metrics.json").read_text())
    assert (metrics["precision"], metrics["bf16"], metrics["attention"]) == ("int8", False, "sdpa")
    assert "precision int8, attention sdpa" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        _main(argv + ["--bf16"])  # two precisions at once: refused, naming both
    assert "--bf16 (deprecated spelling of --precision bf16) conflicts with --precision int8" in capsys.readouterr().err


def test_onnxruntime_evaluation_says_its_runtime_and_a_second_run_reuses_the_export(world, capsys):
    pytest.importorskip("onnxruntime")
    argv = ["--config", str(world.config_path), "--split", "test", "--quiet", "--precision", "int8", "--runtime", "onnxruntime"]
    runs = []
    for _ in range(2):
        assert _main(argv) == 0
        runs.append(json.loads((world.run_dir / "eval" / "test-final" / "metrics.json").read_text()))
    first, second = runs
    assert (first["runtime"], first["precision"], first["onnx_export"]["reused"]) == ("onnxruntime", "int8", False)
    assert second["onnx_export"] == {"dir": first["onnx_export"]["dir"], "reused": True}
    assert Path(first["onnx_export"]["dir"]).parent == world.run_dir / ".onnx"  # beside final/, keyed by its weights
    assert second["chunk"]["accuracy"] == first["chunk"]["accuracy"]
    out = capsys.readouterr().out
    assert "precision int8, attention fused (onnxruntime Attention), runtime onnxruntime (exported)" in out
    assert "runtime onnxruntime (cached export reused)" in out
