"""Evaluate one checkpoint on one prepared split: load it as the task's model, predict, and have the task
score the outputs and write its report beside metrics.json."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from pipeline import artifacts, tasks
from pipeline.config import Config
from pipeline.evaluation import model as model_io
from pipeline.inference import backends, predict
from pipeline.inference.first_token import compute_first_token_only
from pipeline.training import card, rundir, trackers


def output_dir(cfg: Config, ckpt: Path, own: bool) -> Path:
    """<run_dir>/eval/<split>-<checkpoint>: 'final'/'best'/'last' as asked, else the checkpoint's folder name;
    a checkpoint that is not this run's own (`own`: rundir.belongs, by identity; one set aside by --restart
    under run_dir is another run's) gets `other-<name>-<hash of its path>`, never this run's own folder."""
    if not own:
        name = f"other-{ckpt.name}-{artifacts.fingerprint(str(ckpt.resolve()))[:8]}"
    else:
        name = cfg.eval.checkpoint if cfg.eval.checkpoint in ("final", "best", "last") else ckpt.name
    return cfg.run_dir / "eval" / f"{cfg.eval.split}-{name}"


def select_split(splits: Any, name: str, where: Path) -> Any:
    if name not in splits:
        raise ValueError(f"split '{name}' is not in the prepared data ({where}); available: {', '.join(splits.keys())}")
    if len(splits[name]) == 0:
        raise ValueError(f"split '{name}' of the prepared data ({where}) has no rows; pick another split")
    return splits[name]


def _documents(prepared: Any, dataset: Any, split: str) -> int:
    """How many documents the split's rows are: distinct ids (a classifier's chunks), or what the task recorded
    (causal_lm's blocks hold pieces of many documents)."""
    if "id" in dataset.column_names:
        return len(set(dataset["id"][:]))
    return int(prepared.info.get("documents", {}).get(split, 0))


def _test_set(prepared: Any, documents: int) -> str:
    """metrics.json's test_set: which test set was scored, from the manifests of the prepared data."""
    from pipeline.data.runner import stage_manifests

    return describe_test_set(stage_manifests(prepared.stage_dir), documents)


def describe_test_set(manifests: dict[str, dict], documents: int) -> str:
    """Which test set `documents` scored documents are, from the prepare manifests behind them
    (runner.stage_manifests): the source's official split kept whole, a deduplicated one, or one
    held out by hash. Counts are documents (rows before chunking)."""
    dedup, split = manifests.get("dedup"), manifests.get("split")
    if dedup is None or split is None:
        return f"unknown ({documents} documents; the prepare manifests of dedup and split are not next to the data)"
    cleaned = sum(manifests.get("clean", {}).get("dropped", {}).values())
    note = f"; clean dropped {cleaned} rows of any split before dedup" if cleaned else ""
    source = dedup["stats"].get("test_split")
    if not split["stats"].get("source_split_kept") or source is None:
        return f"held out by hash ({documents} documents; split.test of the rows, not a split of the source{note})"
    rows = source["rows"]
    if source["kept_whole"]:
        lost = rows - documents
        kept = f"all {rows} rows kept" if not lost else f"{documents} of {rows} rows, {lost} dropped after dedup"
        return f"official ({kept}; {source['kept_within_test']} within-test copies reported{note})"
    leaks = split["dropped"].get("leak_test", 0)
    contaminated = split["dropped"].get("contaminated_test", 0)
    by_ngrams = f", {contaminated} by the n-gram contamination check" if contaminated else ""
    return (f"deduplicated ({documents} of {rows} rows; {source['removed']} removed by dedup, "
            f"{leaks} by the leakage check{by_ngrams}{note})")


def _check_vocabulary(model: Any, ckpt: Path, cfg: Config, task: Any, prepared: Any, dataset: Any) -> Any:
    """Before any work: the model was trained with the prepared data's tokenizer (a model of another
    vocabulary scores garbage, or fails inside torch on an id past its embeddings) and embeds every id
    and position of the split. Returns that tokenizer."""
    from pipeline.data.prepared import longest_example
    from pipeline.training import build

    model_io.check_same_vocabulary(ckpt, cfg.run_dir, prepared.tokenizer_dir)
    tok = build.load_tokenizer(prepared.tokenizer_dir, cfg.model.from_scratch)
    build.check_fit(model, tok, dataset, longest_example(prepared, cfg, task), f"checkpoint {ckpt}",
                    task.max_tokens_setting)
    return tok


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

    trackers.check_installed([n for n in cfg.train.report_to if n != "tensorboard"])
    task = tasks.get(cfg.task)
    prepared = load_prepared(cfg, task, config_path)
    dataset = select_split(prepared.splits, cfg.eval.split, cfg.data_dir)
    ckpt = model_io.resolve_checkpoint(cfg.run_dir, cfg.eval.checkpoint)
    model = model_io.load_model(ckpt, cfg.run_dir, task.model_class())
    task.check_model(model, prepared.info, ckpt)
    compute_first_token_only(model)  # a BERT-family classifier's head reads one position of the last layer
    tok = _check_vocabulary(model, ckpt, cfg, task, prepared, dataset)
    if task.check_settings is not None:
        task.check_settings(model, tok, cfg)
    accelerator = make_accelerator()  # one gloo group when launched as several CPU processes
    start = time.perf_counter()
    precision, why = backends.resolve(cfg.eval, accelerator.device.type)
    runtime = cfg.eval.runtime
    onnx_dir = _onnx_cache(ckpt, model, precision, runtime)
    reused = onnx_dir is not None and artifacts.check_files(onnx_dir) is None  # predict re-exports one that is not
    logits = predict.predict_logits(model, dataset, cfg.eval.batch_size, accelerator, precision, progress,
                                    runtime, onnx_dir, scratch=cfg.run_dir, outputs=task.outputs, columns=task.columns,
                                    width=task.output_width)
    seconds = time.perf_counter() - start
    if not accelerator.is_main_process:
        accelerator.end_training()
        return None
    trained_on = model_io.training_data_fingerprint(ckpt)
    if trained_on is not None and not is_same_data(trained_on, prepared):
        print(f"warning: {ckpt} was trained on other prepared data (fingerprint {trained_on}) than this config's "
              f"({prepared.fingerprint}); split '{cfg.eval.split}' may overlap what it was trained on", file=sys.stderr)
    scored = task.evaluate(logits, dataset, prepared.info)  # the task's part of metrics.json
    own = rundir.belongs(cfg.run_dir, ckpt)
    out = output_dir(cfg, ckpt, own)
    metrics = {
        "split": cfg.eval.split, "checkpoint": cfg.eval.checkpoint, "checkpoint_path": str(ckpt),
        "step": model_io.checkpoint_step(ckpt), **scored,
        "seconds": round(seconds, 3), "examples_per_second": len(dataset) / max(seconds, 1e-9),
        "processes": accelerator.num_processes, "precision": precision, "precision_chosen_by": why, "bf16": precision == "bf16",
        "runtime": runtime,
        "onnx_export": None if runtime == "torch" else {"dir": str(onnx_dir) if onnx_dir else None, "reused": reused},
        "attention": backends.attention_of(model) if runtime == "torch" else "fused (onnxruntime Attention)",
        "batch_size": cfg.eval.batch_size,
        "test_set": _test_set(prepared, _documents(prepared, dataset, cfg.eval.split)) if cfg.eval.split == "test" else None,
        "data_fingerprint": prepared.fingerprint, "training_data_fingerprint": trained_on, "output_dir": str(out), "versions": artifacts.library_versions(),
    }
    samples = task.samples(model, tok, cfg, metrics["step"]) if task.samples is not None else []
    with artifacts.atomic_dir(out, replace=True) as tmp:  # never a half-written report
        artifacts.write_json_atomic(tmp / "metrics.json", metrics)
        task.write_report(tmp, metrics, logits, dataset, cfg.eval)
        if samples:
            artifacts.write_jsonl_atomic(tmp / "samples.jsonl", samples)
    if own:  # into the training run's tracker runs, and final/README.md gains this split's figures
        trackers.log_evaluation(cfg, cfg.run_dir, metrics, metrics["step"])
        if ckpt.resolve() == (cfg.run_dir / "final").resolve():
            card.write(cfg)
    else:  # what this run did not produce stays out of its trackers and its card
        print(f"{ckpt} is not this run's model: its scores are in {out}, not in {cfg.run_dir}'s trackers or model "
              f"card", file=sys.stderr)
    accelerator.end_training()
    return metrics
