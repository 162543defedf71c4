"""Resume cost and checkpoint cost.

    python bench/bench_resume.py [--rows 1000000] [--repeats 2]

1. Time from `python pipeline/train.py --resume PATH` to its first resumed step, for a checkpoint
   early and one late in an epoch of a large dataset (tiny model, batch 32): the two should be about
   equal, because the epoch order is rebuilt and the loader starts at the saved batch. Next to it,
   what skipping by iterating through the earlier batches would cost (measured on a slice, scaled).
2. Checkpoint save and load time (MiniLM weights + AdamW state) with 1 and 2 processes (torchrun,
   gloo): this format (accelerate's save_state/load_state, fsync, sha256 manifest, rename; load:
   weights-only check of every pickle, load_state, JSON RNG) against the previous format
   (safetensors + JSON, run from git at BEFORE) and against copying / reading the same bytes.
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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

    from pipeline import artifacts, tasks
    from pipeline.checks import load_config
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
        "stage_dir": str(stage), "fingerprint": f"big-{rows}", "config_fingerprint": data_config_fingerprint(cfg, tasks.get(cfg.task)),
        "task": "classification", "data_info": {"label_names": ["a", "b", "c"]}})  # prepared.json as prepare writes it
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

    from pipeline import tasks
    from pipeline.checks import load_config
    from pipeline.data.prepared import load_prepared
    from pipeline.tasks.classification.collate import Collator
    from pipeline.training import batching

    cfg = load_config(config)
    prep = load_prepared(cfg, tasks.get(cfg.task))
    train = prep.splits["train"]
    order = batching.epoch_order(np.asarray(train["length"]), 42, 0, 32, True)
    pad = AutoTokenizer.from_pretrained(str(prep.tokenizer_dir)).pad_token_id
    loader = batching.make_loader(train, batching.RankBatches(order, 0, 32, 0, batches), Collator(pad, 0), columns=("input_ids", "label"))
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


BEFORE = "a6182963d1c229f520a0e09046a1615d135b6788"  # the last commit with the safetensors + JSON format


def previous_format():
    """checkpoint.py of the safetensors + JSON format, as committed at BEFORE (read from git, run as is)."""
    import types

    import pipeline.training as pkg

    def module(name: str) -> types.ModuleType:
        src = subprocess.run(["git", "-C", str(REPO), "show", f"{BEFORE}:pipeline/training/{name}.py"],
                             check=True, capture_output=True, text=True).stdout
        mod = types.ModuleType(f"before_{name}")
        exec(compile(src, f"{BEFORE[:8]}:{name}.py", "exec"), mod.__dict__)
        return mod

    current = pkg.state_io
    pkg.state_io = module("state_io")  # what the old checkpoint.py imports
    try:
        return module("checkpoint")
    finally:
        pkg.state_io = current


def _copy_and_read(path: Path, dst: Path) -> tuple[float, float]:
    """Seconds to copy every file of a checkpoint (+ fsync), and to read them all back."""
    start = time.perf_counter()
    for f in (q for q in path.rglob("*") if q.is_file()):
        (dst / f.relative_to(path)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dst / f.relative_to(path))
        with open(dst / f.relative_to(path), "rb") as fh:
            os.fsync(fh.fileno())
    copied = time.perf_counter() - start
    start = time.perf_counter()
    for f in (q for q in dst.rglob("*") if q.is_file()):
        f.read_bytes()
    return copied, time.perf_counter() - start


def checkpoint_worker(out: Path, repeats: int) -> None:
    """Run under torchrun (1 or N processes): save and load a MiniLM + AdamW checkpoint in this format
    and the previous one, and copy/read the same bytes; rank 0 writes the medians to out/times_<N>.json."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from pipeline.accel import make_accelerator
    from pipeline.checks import load_config
    from pipeline.models.pretrained import resolve_pretrained
    from pipeline.training import build, checkpoint, state_io

    before = previous_format()
    cfg = load_config(None)
    model = AutoModelForSequenceClassification.from_pretrained(resolve_pretrained(cfg.model.name_or_path), num_labels=3)
    opt, sched = build.build_optimizer(model, cfg.train, 100)
    acc = make_accelerator()
    model, opt = acc.prepare(model, opt)
    model(input_ids=torch.ones(2, 8, dtype=torch.long), labels=torch.zeros(2, dtype=torch.long)).loss.backward()
    opt.step()
    n = acc.num_processes
    times: dict[str, list[float]] = {k: [] for k in ("save", "load", "check", "save_before", "load_before", "copy", "read")}
    for i in range(repeats):
        for fmt, mod in (("", checkpoint), ("_before", before)):
            state = {"step": 1, "epoch": 0, "batch_in_epoch": 1, "num_processes": n}
            acc.wait_for_everyone()
            start = time.perf_counter()
            path = mod.save_checkpoint(acc, out / f"ckpts{n}", f"c{i}{fmt}", model, opt, sched, state)
            times[f"save{fmt}"].append(time.perf_counter() - start)
            acc.wait_for_everyone()
            start = time.perf_counter()
            mod.load_checkpoint(acc, path, model, opt, sched)
            acc.wait_for_everyone()
            times[f"load{fmt}"].append(time.perf_counter() - start)
            if not fmt:  # the part of load that reads every pickle as data only first
                start = time.perf_counter()
                state_io.check_no_code(path)
                times["check"].append(time.perf_counter() - start)
        if acc.is_main_process:
            copied, read = _copy_and_read(out / f"ckpts{n}" / f"c{i}", out / f"copy{n}-{i}")
            times["copy"].append(copied)
            times["read"].append(read)
    if acc.is_main_process:
        sizes = {fmt: sum(f.stat().st_size for f in (out / f"ckpts{n}" / f"c0{fmt}").rglob("*") if f.is_file())
                 for fmt in ("", "_before")}
        result = {k: min(v) for k, v in times.items()}  # best of: the CPU is shared
        (out / f"times_{n}.json").write_text(json.dumps({**result, "mb": sizes[""] / 1e6, "mb_before": sizes["_before"] / 1e6}))
    acc.wait_for_everyone()
    acc.end_training()


def save_table(repeats: int) -> str:
    """checkpoint_worker under 1 and 2 processes (torchrun, gloo), one after the other."""
    tmp = Path(tempfile.mkdtemp(prefix="bench_ckpt_"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "ACCELERATE_USE_CPU": "true"}
    lines = [f"MiniLM-L6 + AdamW state; best of {repeats}; every row includes flush (fsync) of what it writes", "",
             "| processes | this format: save_state + checks | previous format (safetensors + JSON) | plain copy + fsync / read of the same bytes |",
             "|---|---|---|---|"]
    for n in (1, 2):
        subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={n}", __file__,
                        "--checkpoint-worker", str(tmp), "--repeats", str(repeats)], check=True, env=env,
                       capture_output=True)
        t = json.loads((tmp / f"times_{n}.json").read_text())
        lines += [f"| {n}, save | {t['save']:.2f} s ({t['mb']:.0f} MB) | {t['save_before']:.2f} s ({t['mb_before']:.0f} MB) | "
                  f"{t['copy']:.2f} s (x{t['save'] / t['copy']:.1f} for save_state) |",
                  f"| {n}, load | {t['load']:.2f} s (data-only check {t['check']:.2f} s) | {t['load_before']:.2f} s | "
                  f"{t['read']:.2f} s |"]
    shutil.rmtree(tmp, ignore_errors=True)
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--only", choices=("resume", "save"), help="one of the two tables")
    p.add_argument("--checkpoint-worker", type=Path, help=argparse.SUPPRESS)  # save_table's torchrun workers
    args = p.parse_args()
    if args.checkpoint_worker:
        return checkpoint_worker(args.checkpoint_worker, args.repeats)
    if args.only != "save":
        print(resume_table(args.rows, args.repeats))
        print()
    if args.only != "resume":
        print(save_table(max(3, args.repeats)))


if __name__ == "__main__":
    main()
