"""The classifier: AutoModelForSequenceClassification from a pretrained source or a new BERT/GPT-2 built
from the config, with the prepared data's classes as its labels."""

from __future__ import annotations

import os

from pipeline.inference.first_token import compute_first_token_only
from pipeline.models import lora
from pipeline.models.pretrained import load_pretrained, resolve_pretrained
from pipeline.schema import ModelConfig

ATTENTION_DROPOUT_KEYS = ("attention_probs_dropout_prob", "attention_dropout", "attn_pdrop")  # BERT-likes, DistilBERT, GPT-2


def attention_dropout(m: ModelConfig, src: str) -> dict:
    """The from_pretrained override that sets model.attention_dropout ({} to keep the model's own): the
    attention-dropout attribute of this model type's config, whichever name it has."""
    if m.attention_dropout < 0:
        return {}
    from transformers import AutoConfig

    conf = AutoConfig.from_pretrained(src)
    key = next((k for k in ATTENTION_DROPOUT_KEYS if hasattr(conf, k)), None)
    if key is None:
        raise ValueError(f"model.attention_dropout={m.attention_dropout:g}: {type(conf).__name__} ({src}) has none of "
                         f"{', '.join(ATTENTION_DROPOUT_KEYS)} to set; leave model.attention_dropout at -1")
    return {key: m.attention_dropout}


def build_model(cfg, tok, info: dict):
    """A new classifier for the data's classes (`info["label_names"]`): the pretrained model.name_or_path
    with a new head, or a BERT/GPT-2 built from the config (model.from_scratch)."""
    from transformers import AutoModelForSequenceClassification, BertConfig, GPT2Config

    label_names = info["label_names"]
    m = cfg.model
    labels = {"num_labels": len(label_names), "id2label": dict(enumerate(label_names)),
              "label2id": {n: i for i, n in enumerate(label_names)}}
    if not m.from_scratch:
        src = resolve_pretrained(m.name_or_path)
        model, info = load_pretrained(AutoModelForSequenceClassification, src, output_loading_info=True, **labels,
                                      **attention_dropout(m, src), **lora.load_kwargs(cfg))
        if info["missing_keys"] and os.environ.get("RANK", "0") == "0":  # one line, not transformers' report table
            print(f"new, randomly initialised (expected for a new task): {', '.join(sorted(info['missing_keys']))}",
                  flush=True)
        if model.config.pad_token_id is None:
            model.config.pad_token_id = tok.pad_token_id
        compute_first_token_only(model)  # the head reads position 0 of the last layer: compute only that
        return _single_label(model)
    positions = max(cfg.tokenize.max_length, 8)
    positions = -(-positions // 8) * 8  # room for padding to a multiple of 8
    if m.from_scratch == "bert":
        conf = BertConfig(
            vocab_size=len(tok), hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
            num_attention_heads=m.num_heads, intermediate_size=m.intermediate_size,
            hidden_dropout_prob=m.dropout,
            attention_probs_dropout_prob=m.dropout if m.attention_dropout < 0 else m.attention_dropout,
            max_position_embeddings=positions, pad_token_id=tok.pad_token_id, **labels,
        )
    else:
        conf = GPT2Config(
            vocab_size=len(tok), n_positions=positions, n_embd=m.hidden_size, n_layer=m.num_layers,
            n_head=m.num_heads, n_inner=m.intermediate_size, resid_pdrop=m.dropout, embd_pdrop=m.dropout,
            attn_pdrop=m.dropout if m.attention_dropout < 0 else m.attention_dropout, pad_token_id=tok.pad_token_id,
            bos_token_id=tok.bos_token_id if tok.bos_token_id is not None else tok.pad_token_id,
            eos_token_id=tok.eos_token_id if tok.eos_token_id is not None else tok.pad_token_id, **labels,
        )
    model = AutoModelForSequenceClassification.from_config(conf)
    compute_first_token_only(model)
    return _single_label(model)


def _single_label(model):
    """problem_type set as transformers' forward sets it at the first labelled batch (int labels, several classes):
    set up front, the config a train.compile graph was traced with is never changed by that first call (which would
    cost a second compile). Multi-label and regression set their own after this."""
    if model.config.problem_type is None and model.config.num_labels > 1:
        model.config.problem_type = "single_label_classification"
    return model


def model_class():
    """The transformers Auto class a trained classifier loads with."""
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification
