"""predict.py for multi-label, regression and sentence pairs: on the test split's rows written back as a source
file, the same document predictions as evaluate.py --split test (multi-label at the model's tuned thresholds from
final/config.json). The prepared data is the end-to-end tests' (their module fixtures, prepared once); the model an
untrained one of the task's own build_model, exported as training exports it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.evaluation.predictkit import main
from tests.tasks.classification.test_pairs_end_to_end import pairs_config  # noqa: F401 - fixture
from tests.tasks.multilabel.test_end_to_end_multilabel import tags_config  # noqa: F401 - fixture
from tests.tasks.regression.test_end_to_end_regression import regression_config  # noqa: F401 - fixture


def _run(config: Path, thresholds: bool = False):
    """final/ of an untrained model of the config's task (seeded), config.yaml, and the test split's rows as JSONL in
    the source's own field names (clean leaves these synthetic texts as they are)."""
    import torch

    from pipeline import tasks
    from pipeline.checks import load_config
    from pipeline.config import to_yaml
    from pipeline.data.io import pair
    from pipeline.data.prepared import load_prepared
    from pipeline.training import build, rundir

    cfg = load_config(config)
    task = tasks.get(cfg.task)
    prepared = load_prepared(cfg, task)
    tok = build.load_tokenizer(prepared.tokenizer_dir, cfg.model.from_scratch)
    torch.manual_seed(0)
    model = task.build_model(cfg, tok, prepared.info)
    with torch.no_grad():  # an untrained encoder's first token varies little with its input: larger weights
        for weight in (p for p in model.parameters() if p.dim() == 2):
            weight.mul_(6.0)
    if thresholds:  # tuned thresholds, as training saves them in final/config.json (Task.final_config)
        model.config.label_thresholds = {n: 0.2 + 0.3 * k for k, n in enumerate(prepared.info["label_names"])}
    rundir.export_final(model, tok, cfg.run_dir / "final")
    model.config.save_pretrained(cfg.run_dir / "model_config")
    (cfg.run_dir / "config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
    test = prepared.splits["test"]
    src = Path(cfg.output_dir) / "test_rows.jsonl"
    with open(src, "w", encoding="utf-8") as f:
        for doc_id, text in zip(test["id"], test["text"]):
            row = {"id": doc_id}
            if cfg.source.text_pair_field:
                row[cfg.source.text_field], row[cfg.source.text_pair_field] = pair.decode(text)
            else:
                row[cfg.source.text_field] = text
            f.write(json.dumps(row) + "\n")
    return cfg, src


def _both(config: Path, **kw) -> tuple[list[dict], list[dict]]:
    """(predict.py's rows, evaluate.py's documents.jsonl) for the test split, fp32."""
    cfg, src = _run(config, **kw)
    out = src.with_name("predicted.jsonl")
    assert main("predict", ["--run", str(cfg.run_dir), "--input", str(src), "--output", str(out), "--quiet",
                            "--precision", "fp32"]) == 0
    assert main("evaluate", ["--config", str(config), "--split", "test", "--quiet", "--precision", "fp32"]) == 0
    docs = [json.loads(line) for line in (cfg.run_dir / "eval" / "test-final" / "documents.jsonl").open()]
    rows = [json.loads(line) for line in out.open()]
    assert len(rows) == len(docs) >= 10
    return rows, docs


def _same_probabilities(row: dict, doc: dict) -> None:
    assert row["probabilities"].keys() == doc["probabilities"].keys()
    for name, p in doc["probabilities"].items():  # documents.jsonl rounds to 6 decimals
        assert row["probabilities"][name] == pytest.approx(p, abs=1e-6), (doc["id"], name)


def test_multilabel_rows_equal_evaluate_at_the_tuned_thresholds(tags_config):  # noqa: F811
    rows, docs = _both(tags_config, thresholds=True)
    for row, doc in zip(rows, docs):
        assert row["id"] == doc["id"] and row["labels"] == doc["predicted"]
        _same_probabilities(row, doc)
    tuned = {n: 0.2 + 0.3 * k for k, n in enumerate(rows[0]["probabilities"])}
    for row in rows:  # each label over its own tuned threshold: not label.threshold's 0.5
        assert row["labels"] == [n for n, p in row["probabilities"].items() if p >= tuned[n]]
    assert any(row["labels"] != [n for n, p in row["probabilities"].items() if p >= 0.5] for row in rows)


def test_regression_rows_equal_evaluate(regression_config):  # noqa: F811
    rows, docs = _both(regression_config)
    assert [r["id"] for r in rows] == list(range(len(docs)))  # the source has no id column: the record's number
    for row, doc in zip(rows, docs):
        assert row["prediction"] == pytest.approx(doc["prediction"], abs=1e-6)
    assert len({round(r["prediction"], 4) for r in rows}) > 1


def test_pair_rows_equal_evaluate(pairs_config):  # noqa: F811
    rows, docs = _both(pairs_config)
    for row, doc in zip(rows, docs):
        assert row["label"] == doc["prediction"]
        _same_probabilities(row, doc)
