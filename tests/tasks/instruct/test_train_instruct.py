"""task=instruct end to end on a YAML corpus of conversations: prepare, train (answers at step 0 and at each
validation), a resume that equals the run that never stopped, evaluate.py's perplexity of the answers, and a
final export whose tokenizer carries the template, answering through transformers.pipeline()."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from pipeline import tasks
from pipeline.checks import load_config
from pipeline.data import runner
from pipeline.training import signals
from pipeline.training.loop import train
from tests.accelkit import reset

WORDS = [f"w{i}" for i in range(40)]


@pytest.fixture(scope="module")
def chat_config(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("instruct")
    rng = random.Random(0)
    for topic in ("alpha", "beta"):
        convs = [[f"q {' '.join(rng.choices(WORDS, k=rng.randint(1, 6)))}",
                  f"a {' '.join(rng.choices(WORDS, k=rng.randint(1, 6)))}"] for _ in range(40)]
        text = yaml.safe_dump({"categories": [topic], "conversations": convs})
        (root / "src").mkdir(exist_ok=True)
        (root / "src" / f"{topic}.yml").write_text(text, encoding="utf-8")
    tree = {
        "output_dir": str(root / "out"), "task": "instruct",
        "source": {"format": "conversations", "path": str(root / "src"), "glob": "*.yml", "label_field": "categories"},
        "clean": {"keep_lines": True}, "dedup": {"method": "exact"},
        "split": {"train": 0.8, "validation": 0.1, "test": 0.1},
        "tokenize": {"kind": "bpe", "vocab_size": 300, "min_frequency": 0},
        "lm": {"block_size": 64, "prompts": ["q w1"], "sample_tokens": 4, "sample_temperature": 0},
        "model": {"from_scratch": "gpt2", "hidden_size": 32, "num_layers": 2, "num_heads": 2,
                  "intermediate_size": 64, "dropout": 0.1},
        "train": {"epochs": 1, "batch_size": 4, "lr": 3e-3, "warmup_ratio": 0.0, "log_every": 1, "eval_every": 3,
                  "save_every": 3, "keep_last": 5, "save_at_epoch_end": False, "metric_for_best": "perplexity",
                  "group_by_length": False, "max_steps": 6},
        "eval": {"batch_size": 8},
    }
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    runner.run(c := load_config(config), tasks.get(c.task), progress=False)
    return config


def test_an_instruct_run_resumes_exactly_evaluates_and_exports_a_chat_model(chat_config, tmp_path):
    from transformers import pipeline

    from pipeline.evaluation.run import evaluate_checkpoint

    out = tmp_path / "run"
    shutil.copytree(Path(load_config(chat_config).output_dir) / "data", out / "data", symlinks=True)
    cfg = load_config(chat_config, [f"output_dir={out}"])
    reset()
    assert train(cfg, str(chat_config)) == signals.EXIT_OK
    straight = load_file(str(out / "run" / "final" / "model.safetensors"))
    samples = sorted(p.name for p in (out / "run" / "samples").iterdir())
    assert samples == ["step-0000000.jsonl", "step-0000003.jsonl", "step-0000006.jsonl"]
    answer = json.loads((out / "run" / "samples" / "step-0000006.jsonl").read_text().splitlines()[0])
    assert answer["prompt"] == "q w1" and not answer["text"].startswith("q w1")  # the answer alone
    shutil.rmtree(out / "run" / "checkpoints" / "step-0000006")
    shutil.rmtree(out / "run" / "final")
    reset()
    assert train(cfg, str(chat_config), resume="auto") == signals.EXIT_OK
    resumed = load_file(str(out / "run" / "final" / "model.safetensors"))
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)

    prepared = json.loads((out / "data" / "prepared.json").read_text())["data_info"]
    assert prepared["template"] == "plain" and prepared["packing"] is True
    metrics = evaluate_checkpoint(load_config(chat_config, [f"output_dir={out}", "eval.split=validation"]),
                                  str(chat_config), progress=False)
    lm = metrics["lm"]
    stats = json.loads(next((out / "data" / "stages").glob("4-tokenize-*/manifest.json")).read_text())["stats"]
    assert lm["tokens"] == stats["validation"]["target_tokens"] and lm["bytes"] == stats["validation"]["bytes"]
    assert 1 < lm["perplexity"] < 300

    final = out / "run" / "final"
    assert (final / "chat_template.jinja").is_file()
    chat = pipeline("text-generation", model=str(final), device="cpu")
    reply = chat([{"role": "user", "content": "q w1"}], max_new_tokens=4, do_sample=False)[0]["generated_text"]
    assert reply[0] == {"role": "user", "content": "q w1"} and reply[-1]["role"] == "assistant"


def test_instruct_needs_conversations_and_whole_examples(chat_config):
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError, match=r"^task=instruct trains on conversations: set source.format=conversations"):
        load_config(chat_config, ["source.format=csv", "source.path=x.csv"])
    with pytest.raises(ConfigError, match=r"^split.chunk=words: task=instruct keeps each conversation whole"):
        load_config(chat_config, ["split.chunk=words"])
