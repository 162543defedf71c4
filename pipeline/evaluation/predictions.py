"""predict.py's library: a finished run's model on new rows, with the run's own preparation and evaluate's inference.

What each step reuses: the run's recorded config (its config.yaml) and prepared data (the tokenizer, the data info:
load_prepared); the checkpoint as evaluate resolves, verifies and loads it (model.py), with its label and vocabulary
checks; the rows read, cleaned, chunked and tokenized by prepare's functions (inputs.py); the logits of
inference/predict.predict_logits in evaluate's precision and runtime (backends); a document's prediction from its
chunks by the task (Task.predictions, the mean of the chunks' outputs as evaluate's documents.jsonl). The output is
resumable (resumable.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import artifacts, tasks
from pipeline.evaluation import inputs, resumable
from pipeline.evaluation import model as model_io
from pipeline.inference import backends
from pipeline.inference import predict as infer


@dataclass
class Loaded:
    cfg: Any  # the run's recorded config (with the command line's eval.* settings)
    task: Any
    prepared: Any
    ckpt: Path
    model: Any


def recorded_config_path(run_dir: Path) -> Path:
    """The config a run recorded (train.py writes it at each launch), or a one-line error: not a training run."""
    path = Path(run_dir) / "config.yaml"
    if not path.is_file():
        raise ValueError(f"{run_dir} is not a training run (no config.yaml, which train.py writes): pass --run the "
                         f"run folder of a finished training (<output_dir>/run)")
    return path


def load(cfg: Any) -> Loaded:
    """The checkpoint cfg.eval.checkpoint names, loaded and checked as evaluate.py does, with the prepared data it
    was trained with."""
    from pipeline.data.prepared import load_prepared

    task = tasks.get(cfg.task)
    prepared = load_prepared(cfg, task, str(recorded_config_path(cfg.run_dir)))
    try:
        ckpt = model_io.resolve_checkpoint(cfg.run_dir, cfg.eval.checkpoint)
    except (FileNotFoundError, ValueError) as e:
        raise ValueError(f"{cfg.run_dir} is not a finished run for --checkpoint {cfg.eval.checkpoint}: {e}") from None
    model = model_io.load_model(ckpt, cfg.run_dir, task.model_class())
    task.check_model(model, prepared.info, ckpt)  # multilabel: the model's tuned thresholds into prepared.info
    model_io.check_same_vocabulary(ckpt, cfg.run_dir, prepared.tokenizer_dir)
    return Loaded(cfg, task, prepared, ckpt, model)


def generation_precision(run: Loaded) -> Any:
    """Generation in evaluate's precision: bf16 autocast where eval.precision resolves to bf16 (the model stays on
    the CPU, where generation runs), else fp32."""
    import torch

    device = torch.device("cpu")
    precision, _ = backends.resolve(run.cfg.eval, device.type)
    return backends.autocast(device, precision)


def _input_identity(path: Path) -> list:
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    return [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def key(run: Loaded, path: Path, source: Any, part_bytes: int, settings: tuple) -> str:
    """What a resumed output must be a prediction of: the input (its files' paths, sizes and times), the weights (the
    checkpoint's manifest), how the input is read and cut, and the settings (precision, runtime, sampling)."""
    manifest = run.ckpt / artifacts.MANIFEST
    weights = manifest.read_text(encoding="utf-8") if manifest.is_file() else str(run.ckpt.resolve())
    return artifacts.fingerprint(_input_identity(path), weights, str(source), part_bytes, str(settings))


@dataclass(frozen=True)
class Generation:
    """What the language-model tasks do with a file's rows: generate (and score perplexity) with these."""

    tok: Any
    sampling: Any  # generate.Sampling
    perplexity: bool = False


def _predicted(run: Loaded, batch: inputs.Batch, model: Any, infer_args: tuple, lm: Generation | None,
               conversational: bool) -> list[dict]:
    """The kept documents' predictions, in order: the task's (Task.predictions of the chunks' outputs), or text."""
    if lm is not None:
        from pipeline.evaluation import generate

        kept = [t for t, reason in zip(batch.texts, batch.dropped) if not reason]
        with generation_precision(run):
            return generate.rows(model, lm.tok, run.prepared.info, kept, conversational, lm.sampling, lm.perplexity)
    docs = batch.rows["doc"]
    return run.task.predictions(_outputs(run, model, batch, *infer_args), docs, run.prepared.info) if docs else []


def _rows(batch: inputs.Batch, predicted: list[dict]) -> list[dict]:
    """One output row per document of the part, in input order: its prediction, or why clean dropped it."""
    predicted = iter(predicted)
    return [{"id": doc_id, "skipped": reason} if reason else {"id": doc_id, **next(predicted)}
            for doc_id, reason in zip(batch.ids, batch.dropped)]


def _dataset(rows: dict) -> Any:
    import datasets

    return datasets.Dataset.from_dict({k: v for k, v in rows.items() if k != "doc"})


def _outputs(run: Loaded, model: Any, batch: inputs.Batch, accelerator: Any, precision: str, runtime: str,
             onnx_dir: Any, ready: Any) -> np.ndarray:
    """(chunks, k) outputs of the part's chunks, by evaluate's predict_logits (`ready`: the inference model)."""
    width = run.task.output_width or model.config.num_labels
    if not batch.rows["doc"]:
        return np.zeros((0, width), dtype=np.float32)
    return infer.predict_logits(model, _dataset(batch.rows), run.cfg.eval.batch_size, accelerator, precision, False,
                                runtime, onnx_dir, run.cfg.run_dir, run.task.outputs, run.task.columns, width,
                                ready=ready)


def _count(counts: dict, rows: list[dict], batch: inputs.Batch) -> None:
    counts["documents"] += len(rows)
    counts["skipped_by_clean"] += sum(1 for r in batch.dropped if r and r != "empty")
    counts["empty"] += sum(1 for r in batch.dropped if r == "empty")
    counts["bad_lines"] += batch.bad


def predict_file(run: Loaded, path: Path, output: Path, source: Any, part_bytes: int, progress: bool = True,
                 lm: Generation | None = None) -> dict:
    """Every document of `path` predicted into `output`, part by part (resumable); returns the counts. `lm`: the
    language-model tasks' generation settings (they predict text)."""
    from tqdm.auto import tqdm

    from pipeline.accel import make_accelerator
    from pipeline.data.io import conversation
    from pipeline.inference.first_token import compute_first_token_only

    cfg = run.cfg
    accelerator = make_accelerator()
    precision, _ = backends.resolve(cfg.eval, accelerator.device.type)
    runtime = cfg.eval.runtime
    pieces = inputs.plan(path, source, part_bytes)
    compute_first_token_only(run.model)
    model = run.model.to(accelerator.device).eval()
    onnx_dir = None
    if runtime == "onnxruntime":
        from pipeline.inference import onnx_export

        onnx_dir = onnx_export.cache_dir(run.ckpt, model, precision)
    ready = None if lm is not None else backends.for_inference(model, precision, accelerator.device, runtime, onnx_dir,
                                                                cfg.run_dir)
    infer_args = (accelerator, precision, runtime, onnx_dir, ready)
    settings = (precision, runtime, None if lm is None else (lm.sampling, lm.perplexity))
    out = resumable.Output(output, key(run, path, source, part_bytes, settings))  # after every check: no empty file
    counts = {"documents": 0, "skipped_by_clean": 0, "bad_lines": 0, "empty": 0, "parts": len(pieces)}
    if out.resumed:
        print(f"resuming {output}: {out.parts} of {len(pieces)} parts done", file=sys.stderr)
    bar = tqdm(total=len(pieces), initial=out.parts, unit="part", desc="predict", disable=not progress)
    try:
        for batch in inputs.batches(path, pieces, source, cfg, run.prepared.tokenizer_dir, out.parts, out.records):
            rows = _rows(batch, _predicted(run, batch, model, infer_args, lm, conversation.conversational(source)))
            out.commit(rows, len(batch.ids))
            _count(counts, rows, batch)
            bar.update(1)
    except ValueError:
        out.discard_if_empty()
        raise
    finally:
        bar.close()
    out.finish()
    return {**counts, "precision": precision, "runtime": runtime, "output": str(output)}
