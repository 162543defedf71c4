"""Inference precision: int8 dynamic quantization of the encoder, the eval.bf16 alias, and that
validation during training scores through the same precision as evaluate.py."""

import datasets
import numpy as np
import pytest
import torch
from accelerate import Accelerator
from transformers import AutoModelForSequenceClassification

from pipeline.checks import load_config
from pipeline.config import ConfigError
from pipeline.inference import backends, predict
from pipeline.tasks import classification as _classification

CLASSIFICATION = _classification.TASK


def _final(world):
    return AutoModelForSequenceClassification.from_pretrained(world.run_dir / "final").eval()


def _test_split(world):
    return datasets.load_from_disk(str(world.stage_dir / "data"))["test"]


def test_int8_quantizes_the_encoder_linears_on_a_copy_and_keeps_the_head_fp32(world):
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

    model = _final(world)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = backends.quantize_int8(model)
    kinds = {name: type(m) for name, m in q.named_modules()}
    assert kinds["bert.encoder.layer.0.attention.self.query"] is DynamicLinear
    assert kinds["bert.encoder.layer.1.output.dense"] is DynamicLinear
    assert kinds["classifier"] is torch.nn.Linear  # the logits come from an fp32 head
    assert sum(k is DynamicLinear for k in kinds.values()) == 2 * 6 + 1  # 6 per BERT layer, and the pooler
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the original is untouched
    assert not any(isinstance(m, DynamicLinear) for m in model.modules())


def test_int8_logits_stay_close_to_fp32(world):
    model, ds, acc = _final(world), _test_split(world), Accelerator(cpu=True)
    fp32 = predict.predict_logits(model, ds, batch_size=4, accelerator=acc, progress=False)
    int8 = predict.predict_logits(model, ds, batch_size=4, accelerator=acc, precision="int8", progress=False)
    assert int8.shape == fp32.shape == (13, 3)
    assert not np.array_equal(int8, fp32)  # it did run quantized
    scale = np.abs(fp32).max()
    assert np.abs(int8 - fp32).max() < 0.1 * scale  # per-tensor int8 of a 32-wide model: a few percent


def test_int8_of_a_model_without_linear_layers_or_on_a_gpu_is_one_clear_error():
    from transformers import GPT2Config, GPT2ForSequenceClassification

    gpt2 = GPT2ForSequenceClassification(GPT2Config(vocab_size=50, n_positions=16, n_embd=8, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match="no nn.Linear layers to quantize; use eval.precision=fp32"):
        backends.quantize_int8(gpt2)
    with pytest.raises(ValueError, match="runs on a CPU only"):
        backends.for_inference(gpt2, "int8", torch.device("cuda"))


def test_eval_bf16_is_a_deprecated_spelling_of_precision_bf16(capsys, monkeypatch):
    monkeypatch.setattr(backends, "_warned_deprecated", False)
    assert backends.precision_of(load_config(None, ["eval.precision=int8"]).eval) == "int8"
    assert backends.precision_of(load_config(None, []).eval) == "auto"  # resolve() decides it per device (test_auto_precision.py)
    old = load_config(None, ["eval.bf16=true"]).eval
    assert backends.precision_of(old) == "bf16" and backends.precision_of(old) == "bf16"
    assert capsys.readouterr().err.count("eval.bf16 is deprecated") == 1  # said once, not per validation
    with pytest.raises(ConfigError, match="eval.bf16=true .* conflicts with eval.precision=int8; drop eval.bf16"):
        load_config(None, ["eval.bf16=true", "eval.precision=int8"])
    with pytest.raises(ConfigError, match="eval.precision: 'int4' is not one of"):
        load_config(None, ["eval.precision=int4"])


def test_validation_during_training_scores_int8_as_evaluate_does(world):
    from pipeline.tasks.classification.score import logit_metrics
    from pipeline.training.validation import validate

    model, ds, acc = _final(world), _test_split(world), Accelerator(cpu=True)
    model.train()
    got = validate(acc, model, ds, 4, CLASSIFICATION, {"label_names": world.label_names}, precision="int8")
    assert model.training  # handed back in training mode, never quantized in place
    logits = predict.predict_logits(model, ds, batch_size=4, accelerator=acc, precision="int8", progress=False)
    want = logit_metrics(logits, ds["label"][:], world.label_names)
    assert got["loss"] == pytest.approx(want["loss"]) and got["accuracy"] == want["accuracy"]
    # the precision was applied, not ignored: the logits move (this untrained model's loss, near ln 3, may not)
    fp32 = predict.predict_logits(model, ds, batch_size=4, accelerator=acc, progress=False)
    assert np.abs(fp32 - logits).max() > 1e-5, np.abs(fp32 - logits).max()
