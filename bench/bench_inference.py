"""Inference throughput and accuracy by eval.precision (fp32, int8, bf16) and eval.runtime (torch,
onnxruntime) at max_length 128/256/512.

A model trained by this pipeline (configs/default.yaml, the packaged all-MiniLM-L6-v2 fine-tuned on
the tweets; trained first if `--out` has none) predicts, through `predict_logits` exactly as
evaluate.py and validation do:
  - the prepared test split of tweets (~33 tokens): accuracy of each precision against fp32's;
  - long documents built from those test tweets (tweets of one class joined until they pass 512
    tokens: the label is the class), truncated to each max_length: examples/s and accuracy.
All methods in one process, interleaved, median of the repeats; ratios to fp32 are what to read (the
machine is shared). The CPU's flags are printed; bf16 is timed at every length where the CPU has
native bf16, else once, on a few documents at 128, to show what emulation costs. Also: fp32 with
eager attention (what SDPA saves), and where int8's time goes at 256 (profiler).
onnxruntime rows ("ort fp32", "ort int8") run predict_logits with eval.runtime=onnxruntime from an
export cached under `--out` (what a second evaluate.py does: session load included, export not);
the time to export + fuse (+ quantize) + load a session, what the first evaluate.py and every
validation pay, is measured once per precision and printed, and the "incl. export" rows add it.

    OMP_NUM_THREADS=2 python bench/bench_inference.py [--out outputs/bench_inference] [--docs 192] [--repeats 2]

Ours against `transformers.pipeline("text-classification")` (fp32, tweets): bench/bench_inference_pipeline.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

LENGTHS = (128, 256, 512)
ORT = ("fp32", "int8")  # the precisions eval.runtime=onnxruntime runs


def trained_model(out: Path, steps: int) -> Path:
    """<out>/run/final, trained by the pipeline itself (prepare + train) when not there yet."""
    final = out / "run" / "final"
    if (final / "config.json").is_file():
        return final
    common = ["--config", str(REPO / "configs" / "default.yaml"), f"output_dir={out}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    subprocess.run([sys.executable, str(REPO / "pipeline" / "prepare.py"), *common], check=True, env=env)
    subprocess.run([sys.executable, str(REPO / "pipeline" / "train.py"), *common, f"train.max_steps={steps}",
                    "train.eval_every=0", "train.save_every=0"], check=True, env=env)
    print(f"trained {final} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return final


def long_documents(texts: list[str], labels: np.ndarray, n: int, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """n documents of 40 tweets of one class (~600 words, past 512 tokens), classes in the split's proportions."""
    rng = np.random.default_rng(seed)
    doc_labels = rng.choice(labels, size=n)
    by_class = {c: np.flatnonzero(labels == c) for c in np.unique(labels)}
    docs = [" ".join(texts[i] for i in rng.choice(by_class[c], size=40)) for c in doc_labels]
    return docs, doc_labels


def tokenized(tokenizer, texts: list[str], max_length: int):
    import datasets

    enc = tokenizer(texts, truncation=True, max_length=max_length)  # unpadded, as the tokenize stage stores it
    return datasets.Dataset.from_dict({"input_ids": enc["input_ids"]})


def predict(model, dataset, batch: int, precision: str, onnx_dir: Path | None = None) -> np.ndarray:
    """predict_logits at `precision`; with `onnx_dir`, eval.runtime=onnxruntime from the export cached there."""
    from accelerate import Accelerator

    from pipeline.inference.predict import predict_logits

    runtime = "torch" if onnx_dir is None else "onnxruntime"
    return predict_logits(model, dataset, batch, Accelerator(cpu=True), precision, progress=False,
                          runtime=runtime, onnx_dir=onnx_dir)


def ort_exports(model, out: Path) -> tuple[dict, dict]:
    """precision -> (cache folder, seconds to export + fuse (+ quantize) + load a session), exported afresh."""
    import shutil

    import torch

    from pipeline.inference.backends import for_inference

    dirs, seconds = {}, {}
    for p in ORT:
        dirs[p] = out / "onnx" / p
        shutil.rmtree(dirs[p], ignore_errors=True)
        start = time.perf_counter()
        for_inference(model, p, torch.device("cpu"), "onnxruntime", onnx_dir=dirs[p])
        seconds[p] = time.perf_counter() - start
    return dirs, seconds


def timed(methods: dict, repeats: int) -> tuple[dict, dict]:
    """name -> (median seconds, logits); the methods interleaved so a busy neighbour slows all alike."""
    times: dict = {name: [] for name in methods}
    logits: dict = {}
    for _ in range(repeats):
        for name, fn in methods.items():
            start = time.perf_counter()
            logits[name] = fn()
            times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()}, logits


def int8_profile(model, dataset, batch: int) -> str:
    """Shares of int8 inference time at this length, by operator family (one batch)."""
    import torch
    from torch.profiler import profile

    from pipeline.inference.backends import quantize_int8
    from pipeline.inference.padding import pad

    q = quantize_int8(model)
    inputs = pad(dataset["input_ids"][:batch], 0)
    with torch.inference_mode():
        q(**inputs)
        with profile() as prof:
            q(**inputs)
    groups = {"int8 Linear (quantized::linear_dynamic)": "linear_dynamic", "attention (SDPA)": "scaled_dot_product",
              "GELU": "gelu", "LayerNorm": "layer_norm", "residual adds": "aten::add"}
    total = sum(e.self_cpu_time_total for e in prof.key_averages())
    shares = {g: sum(e.self_cpu_time_total for e in prof.key_averages() if key in e.key) / total
              for g, key in groups.items()}
    shares["other"] = 1 - sum(shares.values())
    return ", ".join(f"{g} {v:.0%}" for g, v in shares.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(REPO / "outputs" / "bench_inference"), help="output_dir of the trained model")
    parser.add_argument("--train-steps", type=int, default=80, help="steps of the pipeline run that trains the model")
    parser.add_argument("--docs", type=int, default=192, help="long documents per max_length")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--core-only", action="store_true",
                        help="only fp32, int8 and the onnxruntime rows: no eager attention, int8 kernels-only, bf16 "
                             "emulation or profile (for a loaded machine)")
    args = parser.parse_args()
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from pipeline import tasks
    from pipeline.accel import cpu_has_native_bf16, describe_cpu
    from pipeline.checks import load_config
    from pipeline.data.prepared import load_prepared

    final = trained_model(Path(args.out), args.train_steps)
    model = AutoModelForSequenceClassification.from_pretrained(final).eval()
    eager = AutoModelForSequenceClassification.from_pretrained(final, attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    cfg = load_config(REPO / "configs" / "default.yaml", [f"output_dir={args.out}"])
    test = load_prepared(cfg, tasks.get(cfg.task)).splits["test"]
    labels = np.asarray(test["label"][:])
    native = cpu_has_native_bf16()
    b = args.batch_size
    print(f"{describe_cpu()}; native bf16: {native}; torch {torch.__version__}, threads "
          f"{torch.get_num_threads()}; load average before: {os.getloadavg()[0]:.1f}; model {final}\n")

    precisions = ["fp32", "int8"] + (["bf16"] if native else [])
    onnx, export_s = ort_exports(model, Path(args.out))
    print("export + fuse (+ quantize) + session load, once per evaluate.py run on new weights and per validation: "
          + ", ".join(f"ort {p} {s:.1f} s" for p, s in export_s.items()) + "\n")
    methods = {p: (lambda p=p: predict(model, test, 128, p)) for p in precisions}
    methods |= {f"ort {p}": (lambda p=p: predict(model, test, 128, p, onnx[p])) for p in ORT}
    secs, logits = timed(methods, args.repeats)
    acc = {p: float(np.mean(logits[p].argmax(1) == labels)) for p in methods}
    print(f"tweets test split ({len(test)} tweets, as prepared: max_length {cfg.tokenize.max_length}), batch 128, "
          f"median of {args.repeats} interleaved repeats:\n")
    print("| precision | examples/s | vs fp32 | accuracy | vs fp32 (points) | same predictions as fp32 |")
    print("|---|---:|---:|---:|---:|---:|")
    for p in methods:
        agree = float(np.mean(logits[p].argmax(1) == logits["fp32"].argmax(1)))
        print(f"| {p} | {len(test) / secs[p]:.1f} | {secs['fp32'] / secs[p]:.2f}x | {acc[p]:.2%} | "
              f"{100 * (acc[p] - acc['fp32']):+.2f} | {agree:.2%} |")

    from pipeline.inference.backends import quantize_int8

    start = time.perf_counter()
    quantized = quantize_int8(model)  # what each int8 predict call does first
    print(f"\nquantizing a copy of the model (once per evaluate.py run or validation): "
          f"{time.perf_counter() - start:.2f} s")
    texts = test["text"][:]
    docs, doc_labels = long_documents(texts, labels, args.docs)
    print(f"\nlong documents: {args.docs} of 40 test tweets of one class each, truncated to max_length; "
          f"batch {b}; median of {args.repeats} interleaved repeats\n")
    print("| max_length | method | examples/s | vs fp32 | accuracy | vs fp32 (points) | same predictions as fp32 |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for length in LENGTHS:
        ds = tokenized(tokenizer, docs, length)
        methods = {f"{p}" + (" (SDPA)" if p == "fp32" else ""): (lambda p=p: predict(model, ds, b, p)) for p in precisions}
        if not args.core_only:
            methods["int8, quantized once beforehand (kernels only)"] = lambda: predict(quantized, ds, b, "fp32")
        methods |= {f"ort {p} (cached export)": (lambda p=p: predict(model, ds, b, p, onnx[p])) for p in ORT}
        if length == 256 and not args.core_only:
            methods["fp32, eager attention"] = lambda: predict(eager, ds, b, "fp32")
        secs, logits = timed(methods, args.repeats)
        for p in ORT:  # what a first evaluate.py (or a validation) of these documents costs
            secs[f"ort {p}, incl. export (+ {export_s[p]:.0f} s)"] = secs[f"ort {p} (cached export)"] + export_s[p]
            logits[f"ort {p}, incl. export (+ {export_s[p]:.0f} s)"] = logits[f"ort {p} (cached export)"]
        _rows(length, len(ds), secs, logits, doc_labels)
    if not args.core_only:
        _extras(model, tokenizer, docs, doc_labels, b, native)
    print(f"load average after: {os.getloadavg()[0]:.1f}")


def _extras(model, tokenizer, docs: list[str], doc_labels: np.ndarray, b: int, native: bool) -> None:
    """bf16 emulation on a few documents (where the CPU lacks native bf16) and int8's profile at 256."""
    if not native:  # once, on a few documents: emulation is many times slower
        few = tokenized(tokenizer, docs[:32], 128)
        secs, logits = timed({"fp32 (SDPA)": lambda: predict(model, few, b, "fp32"),
                              "bf16 autocast, EMULATED (no avx512_bf16/amx_bf16)": lambda: predict(model, few, b, "bf16")}, 1)
        _rows(128, len(few), secs, logits, doc_labels[:32])
    print(f"\nwhere int8's time goes at max_length 256 (one batch of {b}): "
          f"{int8_profile(model, tokenized(tokenizer, docs, 256), b)}")


def _rows(length: int, n: int, secs: dict, logits: dict, labels: np.ndarray) -> None:
    base = next(iter(secs))
    acc = {k: float(np.mean(v.argmax(1) == labels)) for k, v in logits.items()}
    for name in secs:
        agree = float(np.mean(logits[name].argmax(1) == logits[base].argmax(1)))
        print(f"| {length} | {name} | {n / secs[name]:.1f} | {secs[base] / secs[name]:.2f}x | {acc[name]:.2%} | "
              f"{100 * (acc[name] - acc[base]):+.2f} | {agree:.2%} |")


if __name__ == "__main__":
    main()
