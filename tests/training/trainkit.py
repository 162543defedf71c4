"""Test kit for the training tests: a prepared dataset built directly (exactly what load_prepared
reads, so these tests do not depend on the prepare stages: a learnable toy task, a tokenizer trained
in a moment, a tiny model), and helpers that run train.py as a real process."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.zygote import Forked, child_env, fork_ranks, fork_run, zygote

REPO = Path(__file__).resolve().parents[2]
LABELS = ["negative", "neutral", "positive"]
CUES = {0: ["awful", "bad", "terrible"], 1: ["okay", "fine", "average"], 2: ["great", "good", "lovely"]}
FILLER = [f"w{i}" for i in range(60)]


def toy_rows(n: int, seed: int) -> list[dict]:
    """Texts of 2-12 filler words with one cue word that decides the label: easy to learn."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = rng.randrange(3)
        words = rng.choices(FILLER, k=rng.randint(2, 12))
        words.insert(rng.randrange(len(words) + 1), rng.choice(CUES[label]))
        rows.append({"id": f"d{seed}-{i}", "text": " ".join(words), "label": label, "chunk": 0})
    return rows


def _tokenizer(texts: list[str], kind: str):
    """The tokenize stage's own trainer (so it is the same in every process), wrapped for transformers."""
    from transformers import PreTrainedTokenizerFast

    from pipeline.config import TokenizeConfig
    from pipeline.data.stages.tokenize import _train_bpe, _train_wordpiece

    train = _train_bpe if kind == "bpe" else _train_wordpiece
    tok, specials = train(texts, TokenizeConfig(kind=kind, vocab_size=300 if kind == "bpe" else 200, min_frequency=0))
    return PreTrainedTokenizerFast(tokenizer_object=tok, **specials)


def write_config(path: Path, out_dir: Path, kind: str, train: dict | None = None, model: dict | None = None) -> Path:
    tree = {
        "output_dir": str(out_dir),
        "source": {"format": "jsonl", "path": "toy.jsonl"},
        "label": {"names": LABELS},
        "tokenize": {"kind": "bpe" if kind == "bpe" else "wordpiece", "vocab_size": 300, "max_length": 32},
        "model": {"from_scratch": "gpt2" if kind == "bpe" else "bert", "hidden_size": 32, "num_layers": 2,
                  "num_heads": 2, "intermediate_size": 64, "dropout": 0.1, **(model or {})},
        "train": {"epochs": 2, "batch_size": 8, "lr": 3e-3, "warmup_ratio": 0.1, "log_every": 1, "eval_every": 0,
                  "save_every": 5, "keep_last": 2, "keep_best": 1, **(train or {})},
    }
    path.write_text(yaml.safe_dump(tree), encoding="utf-8")
    return path


def build_prepared(tmp: Path, kind: str = "wordpiece", n_train: int = 160, n_val: int = 48,
                   train: dict | None = None, model: dict | None = None) -> Path:
    """Write a config and the prepared data it points to; return the config path."""
    import datasets

    from pipeline import artifacts, tasks
    from pipeline.checks import load_config
    from pipeline.data.runner import PREPARED, data_config_fingerprint

    config = write_config(tmp / "config.yaml", tmp / "out", kind, train, model)
    cfg = load_config(config)
    splits = {"train": toy_rows(n_train, 1), "validation": toy_rows(n_val, 2), "test": toy_rows(n_val, 3)}
    tok = _tokenizer([r["text"] for r in splits["train"]], kind)
    stage = cfg.data_dir / "stages" / "5-tokenize-toy"
    features = datasets.Features({"id": datasets.Value("string"), "text": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=LABELS), "chunk": datasets.Value("int64")})
    dd = {}
    for name, rows in splits.items():
        ds = datasets.Dataset.from_list(rows, features=features)
        enc = tok([r["text"] for r in rows], truncation=True, max_length=cfg.tokenize.max_length)
        ds = ds.add_column("input_ids", enc["input_ids"]).add_column("attention_mask", enc["attention_mask"])
        dd[name] = ds.add_column("length", [len(x) for x in enc["input_ids"]])
    datasets.DatasetDict(dd).save_to_disk(str(stage / "data"))
    tok.save_pretrained(str(stage / "tokenizer"))
    artifacts.write_json_atomic(stage / artifacts.MANIFEST, artifacts.manifest(stage="tokenize", stats={"label_names": LABELS}))
    artifacts.write_json_atomic(cfg.data_dir / PREPARED, {
        "stage_dir": str(stage), "fingerprint": f"toy-{kind}-{n_train}", "config_fingerprint": data_config_fingerprint(cfg, tasks.get(cfg.task)),
        "task": "classification", "data_info": {"label_names": LABELS},
    })
    return config


def build_prepared_lm(tmp: Path, train: dict | None = None, model: dict | None = None, n_docs: int = 56) -> Path:
    """A folder of n_docs short documents prepared for task=causal_lm by the real stages (seconds): blocks
    of 16 tokens with many document boundaries, a 300-token BPE and the tiny GPT-2 of write_config.
    Returns the config path; the run lies where run_dir says, as for build_prepared."""
    from pipeline import tasks
    from pipeline.checks import load_config
    from pipeline.data import runner

    rng = random.Random(0)
    src = tmp / "src" / "all"
    src.mkdir(parents=True)
    for i in range(n_docs):  # verses of 1-8 filler words: lengths from a line to ~100 tokens
        lines = [" ".join(rng.choices(FILLER[:30], k=rng.randint(1, 8))) for _ in range(rng.randint(1, 14))]
        (src / f"{i:03d}.txt").write_text("\n".join(lines), encoding="utf-8")
    config = write_config(tmp / "config.yaml", tmp / "out", "bpe", train, model)
    tree = yaml.safe_load(config.read_text(encoding="utf-8"))
    tree.pop("label")
    tree.update({
        "task": "causal_lm", "source": {"format": "folder", "path": str(tmp / "src"), "package": "", "label_field": ""},
        "clean": {"keep_lines": True}, "dedup": {"method": "none"},
        "split": {"train": 0.8, "validation": 0.1, "test": 0.1, "stratify": False},
        "tokenize": {"kind": "bpe", "vocab_size": 300, "min_frequency": 0},
        "lm": {"block_size": 16, "prompts": ["w1"], "sample_tokens": 4},
    })
    tree["train"] = {"metric_for_best": "perplexity", "group_by_length": False, **tree["train"]}
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    runner.run(c := load_config(config), tasks.get(c.task), progress=False)
    return config


def build_prepared_instruct(tmp: Path, train: dict | None = None, model: dict | None = None, n_convs: int = 200) -> Path:
    """n_convs short question-answer conversations (YAML, two categories) prepared for task=instruct by the real
    stages: the plain chat template, one conversation per row (lm.packing=false: 160 train rows, as
    build_prepared's), the loss on the answers' tokens; the tiny GPT-2 of write_config."""
    from pipeline import tasks
    from pipeline.checks import load_config
    from pipeline.data import runner

    rng = random.Random(0)
    (tmp / "src").mkdir(parents=True)
    for k, topic in enumerate(("alpha", "beta")):
        convs = [[f"q{j} " + " ".join(rng.choices(FILLER[:30], k=rng.randint(1, 5))),
                  "a " + " ".join(rng.choices(FILLER[:30], k=rng.randint(1, 5)))] for j in range(n_convs // 2)]
        (tmp / "src" / f"{topic}.yml").write_text(yaml.safe_dump({"categories": [topic], "conversations": convs}),
                                                  encoding="utf-8")
    config = write_config(tmp / "config.yaml", tmp / "out", "bpe", train, model)
    tree = yaml.safe_load(config.read_text(encoding="utf-8"))
    tree.pop("label")
    tree.update({
        "task": "instruct",
        "source": {"format": "conversations", "path": str(tmp / "src"), "glob": "*.yml", "package": "",
                   "label_field": "categories"},
        "clean": {"keep_lines": True}, "dedup": {"method": "none"},
        "split": {"train": 0.8, "validation": 0.1, "test": 0.1, "stratify": False},
        "tokenize": {"kind": "bpe", "vocab_size": 300, "min_frequency": 0},
        "lm": {"block_size": 64, "packing": False, "prompts": ["q1 w1"], "sample_tokens": 4, "sample_temperature": 0},
    })
    tree["train"] = {"metric_for_best": "perplexity", "group_by_length": False, **tree["train"]}
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    runner.run(c := load_config(config), tasks.get(c.task), progress=False)
    return config


def train_cmd(config: Path, *extra: str) -> list[str]:
    return [sys.executable, str(REPO / "pipeline" / "train.py"), "--config", str(config), *extra]


def run_train(config: Path, *extra: str, timeout: int = 180) -> subprocess.CompletedProcess:
    return subprocess.run(train_cmd(config, *extra), capture_output=True, text=True, timeout=timeout, env=child_env(), cwd=REPO)


def run_dir(config: Path) -> Path:
    return config.parent / "out" / "run"


def launch(config: Path, *extra: str, crash: tuple[str, int] | None = None, nan_from: int | None = None,
           log_name: str = "proc") -> subprocess.Popen:
    """Start train.py as a real process, or the crash_in_save wrapper (crash=(point, nth save)) or the nan_at
    wrapper (a NaN loss from the nan_from-th training forward pass on); output goes to files."""
    cmd = train_cmd(config, *extra)
    if crash:
        cmd = [sys.executable, str(Path(__file__).with_name("crash_in_save.py")), crash[0], str(crash[1]), *cmd[2:]]
    elif nan_from:
        cmd = [sys.executable, str(Path(__file__).with_name("nan_at.py")), str(nan_from), *cmd[2:]]
    out = open(config.parent / f"{log_name}.log", "w")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(), cwd=REPO)


def log_text(config: Path, log_name: str = "proc") -> str:
    return (config.parent / f"{log_name}.log").read_text(errors="replace")


def records(run: Path, kind: str = "train") -> list[dict]:
    """metrics.jsonl rows: kind 'train' (per-step), 'eval' or 'all'."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written right now
            continue
    if kind == "train":
        return [r for r in rows if "loss" in r and "eval" not in r and "event" not in r]
    if kind == "eval":
        return [r for r in rows if "eval" in r]
    return rows


def wait_for_step(proc: subprocess.Popen, run: Path, step: int, timeout: float = 120) -> bool:
    """Poll metrics.jsonl until a training record reaches `step` (True) or the process ends (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(r["step"] >= step for r in records(run)):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    raise TimeoutError(f"no step {step} within {timeout}s")


def trajectory(run: Path) -> list[tuple]:
    """(step, loss, lr, grad_norm) per step, and the eval metrics: what must be identical after resume."""
    train = [(r["step"], r["loss"], r["lr"], r["grad_norm"]) for r in records(run)]
    evals = [(r["step"], r["eval"]) for r in records(run, "eval")]
    return train + evals


def final_weights(run: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run / "final" / "model.safetensors"))


def clone_prepared(config: Path, dest: Path) -> Path:
    """The same prepared bytes under another output_dir: runs that must match read one copy of the data
    (byte for byte the same as building it again, which the tokenizer test pins, at a copy's cost)."""
    import shutil

    from pipeline import artifacts
    from pipeline.data.runner import PREPARED

    dest.mkdir(parents=True, exist_ok=True)
    src_data = config.parent / "out" / "data"
    shutil.copytree(src_data, dest / "out" / "data")
    info = artifacts.read_json(src_data / PREPARED)
    info["stage_dir"] = str(dest / "out" / "data" / Path(info["stage_dir"]).relative_to(src_data))
    artifacts.write_json_atomic(dest / "out" / "data" / PREPARED, info)
    text = config.read_text(encoding="utf-8").replace(str(config.parent / "out"), str(dest / "out"))
    (dest / "config.yaml").write_text(text, encoding="utf-8")
    return dest / "config.yaml"


def with_pretrained_base(config: Path, peft: dict | None = None) -> Path:
    """Turn a build_prepared(_lm) config into a LoRA run on a "pretrained" base: the tiny model its from-scratch
    settings build (seed 0; a classifier's body only, so loading it as a classifier makes a new head) is saved
    as a folder beside the config, model.name_or_path points there, and the peft section is set."""
    import torch

    from pipeline import tasks
    from pipeline.checks import load_config
    from pipeline.data.prepared import load_prepared
    from pipeline.training.build import load_tokenizer

    cfg = load_config(config)
    prep = load_prepared(cfg, tasks.get(cfg.task), str(config))
    tok = load_tokenizer(prep.tokenizer_dir, cfg.model.from_scratch)
    torch.manual_seed(0)
    model = tasks.get(cfg.task).build_model(cfg, tok, prep.info)
    body = getattr(model, model.base_model_prefix) if cfg.task == "classification" else model
    base = config.parent / "base"
    body.save_pretrained(str(base))
    tok.save_pretrained(str(base))
    tree = yaml.safe_load(config.read_text(encoding="utf-8"))
    tree["model"] = {"name_or_path": str(base), "from_scratch": "", "attention_dropout": 0.0}
    tree["peft"] = {"method": "lora", "r": 4, "alpha": 8, "dropout": 0.1, **(peft or {})}
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    return config


# ---------------------------------------------------------------- train.py forked from the zygote (tests/zygote.py)


def fork_launch(config: Path, *extra: str, crash: tuple[str, int] | None = None, nan_from: int | None = None,
                log_name: str = "proc") -> Forked:
    """launch, forked from the zygote: train.py (or the crash_in_save / nan_at wrapper) as a real process that
    skips the imports; output to <config folder>/<log_name>.log (log_text reads it)."""
    cmd = train_cmd(config, *extra)[1:]
    if crash:
        cmd = [str(Path(__file__).with_name("crash_in_save.py")), crash[0], str(crash[1]), *cmd[1:]]
    elif nan_from:
        cmd = [str(Path(__file__).with_name("nan_at.py")), str(nan_from), *cmd[1:]]
    log = config.parent / f"{log_name}.log"
    return zygote().start(cmd, log, log, child_env())


def fork_run_train(config: Path, *extra: str, timeout: int = 180) -> subprocess.CompletedProcess:
    """run_train, forked from the zygote: stdout and stderr apart, as text."""
    return fork_run(train_cmd(config, *extra)[1:], timeout)


def fork_launch_ranks(config: Path, *extra: str, processes: int = 2, log_name: str = "multi") -> list[Forked]:
    """train.py as `processes` ranks over gloo on this machine (fork_ranks), each with the environment that
    `ACCELERATE_USE_CPU=true accelerate launch --config_file configs/accelerate/cpu_multiprocess.yaml` gives its
    workers (torchrun's, and accelerate's ACCELERATE_*), less the launcher. Rank r's output goes to
    <config folder>/<log_name>-<r>.log."""
    env = {**child_env(), "ACCELERATE_USE_CPU": "true", "ACCELERATE_MIXED_PRECISION": "no",
           "ACCELERATE_DYNAMO_BACKEND": "NO", "ACCELERATE_DYNAMO_MODE": "default",
           "ACCELERATE_DYNAMO_USE_FULLGRAPH": "False", "ACCELERATE_DYNAMO_USE_DYNAMIC": "False"}
    return fork_ranks(train_cmd(config, *extra)[1:], processes, config.parent / log_name, env)
