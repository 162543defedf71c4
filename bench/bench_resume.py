"""Resume cost and checkpoint cost.

    python bench/bench_resume.py [--rows 1000000] [--repeats 2]

1. Time from `python pipeline/train.py --resume PATH` to its first resumed step, for a checkpoint
   early and one late in an epoch of a large dataset (tiny model, batch 32): the two should be about
   equal, because the epoch order is rebuilt and the loader starts at the saved batch. Next to it,
   what skipping by iterating through the earlier batches would cost (measured on a slice, scaled).
2. Checkpoint save time (MiniLM weights + AdamW state; fsync, sha256 read-back, manifest, rename)
   against copying the same bytes with shutil.copyfile + fsync.
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_train import restamp  # noqa: E402 - same folder; re-stamps prepared.json of data a bench built itself


def big_dataset(out: Path, rows: int) -> Path:
    """A prepared layout with `rows` random token sequences (5-60 tokens) and a tiny WordPiece tokenizer."""
    import datasets
    import numpy as np
    import pyarrow as pa
    import yaml
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from pipeline import artifacts
    from pipeline.config import load_config
    from pipeline.data.runner import PREPARED, data_config_fingerprint

    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 61, size=rows)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.integers(5, 500, size=offsets[-1]), pa.int32()))
    ones = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.ones(offsets[-1], dtype=np.int8)))
    labels = rng.integers(0, 3, size=rows)
    table = pa.table({"input_ids": ids, "attention_mask": ones, "length": lengths, "label": labels})
    ds = datasets.Dataset(table).cast_column("label", datasets.ClassLabel(names=["a", "b", "c"]))
    tree = {"output_dir": str(out), "source": {"format": "jsonl", "path": "x"}, "label": {"names": ["a", "b", "c"]},
            "tokenize": {"kind": "wordpiece", "max_length": 64},
            "model": {"from_scratch": "bert", "hidden_size": 32, "num_layers": 2, "num_heads": 2, "intermediate_size": 64},
            "train": {"batch_size": 32, "log_every": 1, "save_every": 2, "eval_every": 0}}
    out.mkdir(parents=True, exist_ok=True)
    config = out / "config.yaml"
    config.write_text(yaml.safe_dump(tree))
    cfg = load_config(config)
    stage = cfg.data_dir / "stages" / "big"
    val = ds.select(range(64))
    datasets.DatasetDict({"train": ds, "validation": val, "test": val}).save_to_disk(str(stage / "data"))
    vocab = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4, **{f"t{i}": i for i in range(5, 500)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]").save_pretrained(str(stage / "tokenizer"))
    artifacts.write_json_atomic(stage / "manifest.json", artifacts.manifest(stage="big"))
    artifacts.write_json_atomic(cfg.data_dir / PREPARED, {
        "stage_dir": str(stage), "fingerprint": f"big-{rows}", "config_fingerprint": data_config_fingerprint(cfg),
        "label_names": ["a", "b", "c"]})
    return config


def moved_checkpoint(src: Path, dst: Path, batch: int) -> Path:
    """A copy of a real checkpoint whose position is `batch` steps into epoch 0 (manifest redone)."""
    from pipeline.artifacts import read_json, write_json_atomic
    from pipeline.training.checkpoint import finalize

    tmp = dst.parent / f".{dst.name}.tmp"
    shutil.copytree(src, tmp)
    (tmp / "manifest.json").unlink()
    state = read_json(tmp / "state.json")
    state.update(step=batch, batch_in_epoch=batch, epoch=0)
    write_json_atomic(tmp / "state.json", state)
    finalize(tmp, dst)
    return dst


def time_to_first_step(config: Path, ckpt: Path, step: int) -> float:
    restamp(config)
    run = config.parent / "run"
    metrics = run / "metrics.jsonl"
    metrics.unlink(missing_ok=True)  # records of an earlier repeat would read as this run's first step
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, str(REPO / "pipeline" / "train.py"), "--config", str(config), "--resume",
                             str(ckpt), f"train.max_steps={step + 3}", "train.save_every=0", "train.save_at_epoch_end=false"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None:
        if metrics.is_file() and any(json.loads(x).get("step") == step + 1 for x in metrics.read_text().splitlines()
                                     if x.startswith("{")):
            elapsed = time.perf_counter() - start
            proc.kill()  # not SIGTERM: that would save a checkpoint on the way out
            proc.wait()
            return elapsed
        time.sleep(0.02)
    raise SystemExit(f"resume from {ckpt} ended without a step:\n{proc.stderr.read()[-3000:]}")


def skip_by_iteration(config: Path, batches: int) -> float:
    """Seconds to iterate `batches` batches through our loader (what skip-by-iteration would pay)."""
    import numpy as np
    from transformers import AutoTokenizer

    from pipeline.config import load_config
    from pipeline.data.prepared import load_prepared
    from pipeline.training import batching

    cfg = load_config(config)
    prep = load_prepared(cfg)
    train = prep.splits["train"]
    order = batching.epoch_order(np.asarray(train["length"]), 42, 0, 32, True)
    pad = AutoTokenizer.from_pretrained(str(prep.tokenizer_dir)).pad_token_id
    loader = batching.make_loader(train, batching.RankBatches(order, 0, 32, 0, batches), batching.Collator(pad, 0))
    start = time.perf_counter()
    for _ in loader:
        pass
    return time.perf_counter() - start


def resume_table(rows: int, repeats: int) -> str:
    tmp = Path(tempfile.mkdtemp(prefix="bench_resume_"))
    config = big_dataset(tmp / "big", rows)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    restamp(config)
    subprocess.run([sys.executable, str(REPO / "pipeline" / "train.py"), "--config", str(config), "train.max_steps=2"],
                   check=True, env=env, capture_output=True)
    root = tmp / "big" / "run" / "checkpoints"
    real = next(p for p in root.iterdir() if not p.name.startswith("."))
    per_epoch = rows // 32
    (tmp / "ckpts").mkdir()  # outside the run's checkpoints/, out of rotation's reach
    early = moved_checkpoint(real, tmp / "ckpts" / "early", 10)
    late = moved_checkpoint(real, tmp / "ckpts" / "late", per_epoch - 10)
    times = {"early": [], "late": []}
    for _ in range(repeats):  # interleaved: the CPU is shared
        for name, ck, step in (("early", early, 10), ("late", late, per_epoch - 10)):
            times[name].append(time_to_first_step(config, ck, step))
    sample = min(2000, per_epoch - 10)
    skip = skip_by_iteration(config, sample) * (per_epoch - 10) / sample
    e, lt = min(times["early"]), min(times["late"])
    return "\n".join([
        f"{rows:,} rows, batch 32: {per_epoch:,} batches per epoch; best of {repeats}, process start to first resumed step",
        "", "| resume position | seconds to first step |", "|---|---|",
        f"| batch 10 (early) | {e:.1f} |", f"| batch {per_epoch - 10:,} (late) | {lt:.1f} (x{lt / e:.2f}) |",
        f"| late, if skipped batches were iterated (scaled from {sample} batches) | +{skip:.0f} |",
    ])


def save_table(repeats: int) -> str:
    import torch
    from accelerate import Accelerator

    from pipeline.config import load_config
    from pipeline.training import build, checkpoint
    from pipeline.training.build import model_source

    cfg = load_config(None)
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_source(cfg.model), num_labels=3)
    opt, sched = build.build_optimizer(model, cfg.train, 100)
    acc = Accelerator(cpu=True)
    model, opt = acc.prepare(model, opt)
    model(input_ids=torch.ones(2, 8, dtype=torch.long), labels=torch.zeros(2, dtype=torch.long)).loss.backward()
    opt.step()
    tmp = Path(tempfile.mkdtemp(prefix="bench_ckpt_"))
    state = {"step": 1, "epoch": 0, "batch_in_epoch": 1}
    ours, copy = [], []
    for i in range(repeats):
        start = time.perf_counter()
        path = checkpoint.save_checkpoint(acc, tmp / "ckpts", f"c{i}", model, opt, sched, state)
        ours.append(time.perf_counter() - start)
        dst = tmp / f"copy{i}"
        dst.mkdir()
        start = time.perf_counter()
        for f in path.iterdir():
            shutil.copyfile(f, dst / f.name)
            with open(dst / f.name, "rb") as fh:
                os.fsync(fh.fileno())
        copy.append(time.perf_counter() - start)
    mb = sum(f.stat().st_size for f in path.iterdir()) / 1e6
    o, c = statistics.median(ours), statistics.median(copy)
    shutil.rmtree(tmp, ignore_errors=True)
    return "\n".join([
        f"MiniLM-L6 + AdamW state: {mb:.0f} MB per checkpoint; median of {repeats}", "",
        "| write | seconds | MB/s |", "|---|---|---|",
        f"| save_checkpoint (write, fsync, sha256 read-back, manifest, rename) | {o:.2f} | {mb / o:.0f} |",
        f"| shutil.copyfile + fsync of the same files | {c:.2f} | {mb / c:.0f} |",
        f"| ratio | {o / c:.2f}x | |",
    ])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=2)
    args = p.parse_args()
    print(resume_table(args.rows, args.repeats))
    print()
    print(save_table(max(3, args.repeats)))


if __name__ == "__main__":
    main()
