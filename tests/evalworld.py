"""Fixtures of tests/evaluation and tests/inference (their conftest.py import them): a complete, tiny world for evaluation tests, built in tmp_path: prepared data as prepare writes
it (prepared.json + a stage directory with manifest), a WordPiece tokenizer, and a run directory
with final/, model_config/ and one complete checkpoint, from a 2-layer BERT built from config."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline import artifacts, tasks
from pipeline.checks import load_config
from pipeline.config import Config
from pipeline.training import checkpoint, rundir

REPO = Path(__file__).resolve().parents[1]
LABELS = ["negative", "neutral", "positive"]
WORDS = "good bad fine great awful okay love hate meh nice terrible average happy sad".split()

# (id, chunk, label, text): "long" is one document cut into three chunks; 13 test rows, so batches of
# 4 over 2 processes leave an uneven padded tail.
TEST_ROWS = [
    ("long", 0, 2, "love this great nice"), ("long", 1, 2, "okay fine average"), ("long", 2, 2, "happy happy good"),
    ("t1", 0, 0, "bad awful"), ("t2", 0, 1, "meh okay average fine"), ("t3", 0, 2, "great"),
    ("t4", 0, 0, "hate hate terrible sad"), ("t5", 0, 1, "fine"), ("t6", 0, 2, "nice good happy love great"),
    ("t7", 0, 0, "sad bad"), ("t8", 0, 1, "average meh"), ("two", 0, 0, "awful hate"), ("two", 1, 0, "bad bad sad terrible"),
]


@dataclass
class World:
    cfg: Config
    config_path: Path  # a YAML whose output_dir is this world's
    run_dir: Path
    stage_dir: Path
    label_names: list
    test_rows: list  # TEST_ROWS: the planted test split


def _tokenizer(path: Path):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator([" ".join(WORDS)] * 3, trainers.WordPieceTrainer(vocab_size=200, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]"
    )
    fast.save_pretrained(path)
    return fast


def _splits(tokenizer, label_names):
    import datasets

    features = datasets.Features({
        "id": datasets.Value("string"), "chunk": datasets.Value("int64"), "text": datasets.Value("string"),
        "label": datasets.ClassLabel(names=label_names),
    })

    def build(rows):
        ds = datasets.Dataset.from_dict(
            {"id": [r[0] for r in rows], "chunk": [r[1] for r in rows], "label": [r[2] for r in rows], "text": [r[3] for r in rows]},
            features=features,
        )
        return ds.map(lambda b: {**tokenizer(b["text"], truncation=True, max_length=16), "length": [0] * len(b["text"])}, batched=True)

    train = [(f"r{i}", 0, i % 3, " ".join(WORDS[i % len(WORDS) : i % len(WORDS) + 3])) for i in range(12)]
    dd = datasets.DatasetDict({"train": build(train), "validation": build(TEST_ROWS[3:8]), "test": build(TEST_ROWS)})
    return dd.map(lambda r: {"length": len(r["input_ids"])})


def _model(vocab_size: int, label_names: list[str], seed: int = 0):
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64, num_labels=len(label_names), pad_token_id=0,
        id2label=dict(enumerate(label_names)), label2id={n: i for i, n in enumerate(label_names)},
    )
    return BertForSequenceClassification(config).eval()


def write_checkpoint(run_dir: Path, name: str, model, step: int, macro_f1: float, data_fp: str) -> Path:
    """checkpoints/<name>/ as training writes it: weights, state.json (with a validation metric), manifest last."""
    from safetensors.torch import save_file

    ckpt = run_dir / "checkpoints" / name
    ckpt.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt / "model.safetensors"))
    state = {"step": step, "epoch": 0, "batch_in_epoch": step, "best": {"metric": "macro_f1", "greater_is_better": True},
             "metrics": {"macro_f1": macro_f1}, "fingerprints": {"data": data_fp}}
    artifacts.write_json_atomic(ckpt / "state.json", state)
    checkpoint.write_manifest(ckpt, kind="checkpoint")  # last
    return ckpt


def export_untrained(run_dir: Path, tokenizer, label_names: list[str]) -> None:
    """final/ and model_config/ of a run, as training exports them (manifest included), from an
    untrained 2-layer BERT: enough for evaluate to run and score."""
    model = _model(len(tokenizer), list(label_names))
    rundir.export_final(model, tokenizer, run_dir / "final")
    model.config.save_pretrained(run_dir / "model_config")


def build_world(root: Path, data_labels=LABELS, model_labels=LABELS) -> World:
    from pipeline.data.runner import PREPARED, data_config_fingerprint

    config_path = root / "eval.yaml"
    text = (REPO / "configs" / "tiny.yaml").read_text(encoding="utf-8").replace("output_dir: outputs/tiny", f"output_dir: {root / 'out'}")
    config_path.write_text(text, encoding="utf-8")
    cfg = load_config(config_path)
    stage_dir = cfg.data_dir / "stages" / "5-tokenize-test"
    tokenizer = _tokenizer(stage_dir / "tokenizer")
    _splits(tokenizer, list(data_labels)).save_to_disk(str(stage_dir / "data"))
    artifacts.write_json_atomic(stage_dir / artifacts.MANIFEST, artifacts.manifest(stage="tokenize"))
    artifacts.write_json_atomic(cfg.data_dir / PREPARED, {
        "stage_dir": str(stage_dir), "fingerprint": "test", "content_fingerprint": "test", "config_fingerprint": data_config_fingerprint(cfg, tasks.get(cfg.task)),
        "task": "classification", "data_info": {"label_names": list(data_labels)},
    })
    export_untrained(cfg.run_dir, tokenizer, list(model_labels))
    write_checkpoint(cfg.run_dir, "step-4", _model(len(tokenizer), list(model_labels), seed=1), step=4, macro_f1=0.6, data_fp="test")
    write_checkpoint(cfg.run_dir, "step-8", _model(len(tokenizer), list(model_labels), seed=2), step=8, macro_f1=0.4, data_fp="other-data")
    return World(cfg, config_path, cfg.run_dir, stage_dir, list(data_labels), TEST_ROWS)


@pytest.fixture
def world(tmp_path) -> World:
    return build_world(tmp_path)


@pytest.fixture
def untrained_model():
    """export_untrained itself, for tests that prepare real data and evaluate on it."""
    return export_untrained


@pytest.fixture
def make_world():
    """build_world itself, for tests that need a world with other label sets."""
    return build_world
