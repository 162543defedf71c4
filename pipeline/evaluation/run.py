"""Evaluate one checkpoint on one prepared split: predict, aggregate, score, write, summarise."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import artifacts
from pipeline.config import Config
from pipeline.evaluation import aggregate, model as model_io
from pipeline.inference import backends
from pipeline.inference import predict
from pipeline.tasks.classification import report
from pipeline.tasks.classification import score


def output_dir(cfg: Config, ckpt: Path) -> Path:
    """<run_dir>/eval/<split>-<checkpoint>: 'final'/'best'/'last' as asked, else the checkpoint's folder name."""
    name = cfg.eval.checkpoint if cfg.eval.checkpoint in ("final", "best", "last") else ckpt.name
    return cfg.run_dir / "eval" / f"{cfg.eval.split}-{name}"


def select_split(splits: Any, name: str, where: Path) -> Any:
    if name not in splits:
        raise ValueError(f"split '{name}' is not in the prepared data ({where}); available: {', '.join(splits.keys())}")
    if len(splits[name]) == 0:
        raise ValueError(f"split '{name}' of the prepared data ({where}) has no rows; pick another split")
    return splits[name]


def _score(dataset: Any, logits: np.ndarray, label_names: list[str]) -> tuple[dict, dict, aggregate.Documents]:
    labels = np.asarray(dataset["label"][:], dtype=np.int64)
    chunk = score.logit_metrics(logits, labels, label_names)
    docs = aggregate.aggregate_documents(dataset["id"][:], logits, labels)
    document = score.logit_metrics(docs.logits, docs.labels, label_names)
    return chunk, document, docs


def _write(out: Path, metrics: dict, dataset: Any, logits: np.ndarray, docs: aggregate.Documents, cfg: Config, step: int) -> None:
    """Everything lands in a temporary folder renamed into place: never a half-written report."""
    names, chars = metrics["label_names"], cfg.eval.snippet_chars
    examples = report.prediction_rows(dataset["id"][:], dataset["label"][:], aggregate.softmax(logits), names, {
        "chunk": dataset["chunk"][:], "text": [report.snippet(t, chars) for t in dataset["text"][:]]})
    documents = report.prediction_rows(docs.ids, docs.labels, aggregate.softmax(docs.logits), names, {
        "chunks": docs.num_chunks.tolist()})
    with artifacts.atomic_dir(out, replace=True) as tmp:
        artifacts.write_json_atomic(tmp / "metrics.json", metrics)
        report.write_jsonl(tmp / "predictions.jsonl", examples)
        report.write_jsonl(tmp / "documents.jsonl", documents)
        report.write_confusion(tmp, "confusion_matrix", metrics["chunk"]["confusion_matrix"], names, f"{cfg.eval.split}: chunks")
        if docs.num_chunks.max() > 1:
            report.write_confusion(tmp, "confusion_matrix_documents", metrics["document"]["confusion_matrix"], names,
                                   f"{cfg.eval.split}: documents")
        report.write_tensorboard(tmp, metrics, names, step)


def _test_set(prepared: Any, documents: int) -> str:
    """metrics.json's test_set: which test set was scored, from the manifests of the prepared data."""
    from pipeline.data.runner import stage_manifests

    return report.describe_test_set(stage_manifests(prepared.stage_dir), documents)


def _onnx_cache(ckpt: Path, model: Any, precision: str, runtime: str) -> Path | None:
    """Where eval.runtime=onnxruntime keeps this checkpoint's export (None: torch, or no manifest to key it by)."""
    if runtime != "onnxruntime":
        return None
    from pipeline.inference import onnx_export

    return onnx_export.cache_dir(ckpt, model, precision)


def evaluate_checkpoint(cfg: Config, config_path: str = "<config>", progress: bool = True) -> dict | None:
    """Run the whole evaluation; the metrics dict on the main process, None on the others."""
    from pipeline.accel import make_accelerator
    from pipeline.data.prepared import is_same_data, load_prepared

    prepared = load_prepared(cfg, config_path)
    dataset = select_split(prepared.splits, cfg.eval.split, cfg.data_dir)
    ckpt = model_io.resolve_checkpoint(cfg.run_dir, cfg.eval.checkpoint)
    model = model_io.load_classifier(ckpt, cfg.run_dir)
    model_io.check_labels(model, prepared.label_names, ckpt)
    accelerator = make_accelerator()  # one gloo group when launched as several CPU processes
    start = time.perf_counter()
    precision, runtime = backends.precision_of(cfg.eval), cfg.eval.runtime
    onnx_dir = _onnx_cache(ckpt, model, precision, runtime)
    reused = onnx_dir is not None and artifacts.is_complete(onnx_dir)
    logits = predict.predict_logits(model, dataset, cfg.eval.batch_size, accelerator, precision, progress,
                                    runtime, onnx_dir, scratch=cfg.run_dir)
    seconds = time.perf_counter() - start
    if not accelerator.is_main_process:
        accelerator.end_training()
        return None
    trained_on = model_io.training_data_fingerprint(ckpt)
    if trained_on is not None and not is_same_data(trained_on, prepared):
        print(f"warning: {ckpt} was trained on other prepared data (fingerprint {trained_on}) than this config's "
              f"({prepared.fingerprint}); split '{cfg.eval.split}' may overlap what it was trained on", file=sys.stderr)
    chunk, document, docs = _score(dataset, logits, prepared.label_names)
    out = output_dir(cfg, ckpt)
    metrics = {
        "split": cfg.eval.split, "checkpoint": cfg.eval.checkpoint, "checkpoint_path": str(ckpt),
        "step": model_io.checkpoint_step(ckpt), "label_names": prepared.label_names,
        "chunk": chunk, "document": document,
        "seconds": round(seconds, 3), "examples_per_second": len(dataset) / max(seconds, 1e-9),
        "processes": accelerator.num_processes, "precision": precision, "bf16": precision == "bf16", "runtime": runtime,
        "onnx_export": None if runtime == "torch" else {"dir": str(onnx_dir) if onnx_dir else None, "reused": reused},
        "attention": backends.attention_of(model) if runtime == "torch" else "fused (onnxruntime Attention)",
        "batch_size": cfg.eval.batch_size,
        "test_set": _test_set(prepared, len(docs.ids)) if cfg.eval.split == "test" else None,
        "data_fingerprint": prepared.fingerprint, "training_data_fingerprint": trained_on, "output_dir": str(out), "versions": artifacts.library_versions(),
    }
    _write(out, metrics, dataset, logits, docs, cfg, metrics["step"])
    accelerator.end_training()
    return metrics
