"""eval.runtime=onnxruntime: the classifier exported to ONNX, fused, optionally int8, run by ONNX Runtime.

Why a second runtime: torch's int8 (backends.quantize_int8) speeds up the Linear layers only;
attention, GELU and LayerNorm stay fp32 and unfused (~40% of int8's time at max_length 256, see
bench/results/inference.md). ONNX Runtime's transformer optimizer fuses them (Attention, SkipLayerNormalization,
BiasGelu, EmbedLayerNormalization) and its dynamic quantization makes the fused attention int8 too.

Steps, all into one folder written atomically (artifacts.atomic_dir: temp + rename, manifest last):
  1. torch.onnx.export (the TorchScript exporter, dynamo=False: it needs no onnxscript) of a copy of
     the model with eager attention. transformers' SDPA attention exports as a graph the fuser does
     not recognise (0 Attention nodes fused); eager attention fuses. Batch and sequence axes dynamic.
     Inputs: what predict_logits feeds (input_ids, attention_mask, and a sentence pair's token_type_ids),
     kept where the model's forward takes them; a single text's token_type_ids are fed as zeros, BERT's
     default in both runtimes.
  2. onnxruntime.transformers.optimizer (model_type "bert"); fewer fused Attention nodes than layers
     is an error, since the speed would not be there.
  3. int8 only: onnxruntime.quantization.quantize_dynamic, int8 weights (PER_CHANNEL below),
     uint8 activations quantized per batch.
The session runs with as many intra-op threads as torch uses (torch.get_num_threads()).

Where the export lives: evaluate.py keeps it beside the checkpoint, `<checkpoint's parent>/.onnx/<key>/`,
key = the checkpoint manifest's sha256 of every file + the model config + precision + package
versions, so a second evaluate.py loads it (no export) and changed weights get a new folder.
Checkpoint rotation removes dot-folders under checkpoints/, so it clears those caches too; they are
only ever re-exported. Validation during training exports once per run and then only puts the new
weights into that fused graph (and quantizes it again for int8): onnx_template.py; each validation's
model.onnx is made in a temporary folder in the run directory, removed once the session has loaded it.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import inspect
import logging
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

from pipeline import artifacts
from pipeline.inference.first_token import compute_every_token

MODEL_FILE = "model.onnx"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # what padding.pad gives predict_logits
FUSABLE = ("bert",)  # model_type values the "bert" fusions were tested on here (BERT, MiniLM)
OPSET = 17
# int8 weights per output channel: on the trained MiniLM it kept more of fp32's tweet predictions than
# per tensor at the same speed (bench/results/inference.md, bench_inference.py's ORT rows).
PER_CHANNEL = True
PACKAGES = ("onnxruntime", "onnx", "torch", "transformers")


def _fail(message: str) -> ValueError:
    return ValueError(f"eval.runtime=onnxruntime: {message}; use eval.runtime=torch")


def package_versions() -> dict[str, str]:
    from importlib import metadata

    try:
        return {name: metadata.version(name) for name in PACKAGES}
    except metadata.PackageNotFoundError as e:
        raise _fail(f"package {e.name} is not installed (pip install -c constraints.txt -e '.[onnx]')") from None


def cache_dir(ckpt: Path, model: Any, precision: str) -> Path | None:
    """<ckpt.parent>/.onnx/<checkpoint name>-<precision>-<key> for a checkpoint with a manifest; None without one
    (exported unverified). The key is of the weights: a checkpoint written again gets a new folder, and the
    export of its older weights is removed then (`cached`)."""
    manifest = Path(ckpt) / artifacts.MANIFEST
    if not manifest.is_file():
        return None
    files = {k: v["sha256"] for k, v in artifacts.read_json(manifest)["files"].items()}
    key = artifacts.fingerprint(files, model.config.to_json_string(), precision, PER_CHANNEL, package_versions())
    return Path(ckpt).parent / ".onnx" / f"{Path(ckpt).name}-{precision}-{key}"


def check_exportable(model: Any) -> None:
    kind = getattr(model.config, "model_type", "?")
    if kind not in FUSABLE:
        raise _fail(f"{type(model).__name__} (model_type {kind!r}) cannot be exported and fused here; "
                    f"only {', '.join(FUSABLE)} models can")


def input_names(model: Any) -> list[str]:
    takes = inspect.signature(model.forward).parameters
    return [name for name in INPUTS if name in takes]


def _export_torch(model: Any, names: list[str], path: Path) -> None:
    """The TorchScript export of an eager-attention fp32 copy; (batch, seq) axes dynamic."""
    import torch
    from accelerate.utils import extract_model_from_parallel

    # a copy: the original keeps its attention and accelerate's autocast wrapper (dropped on the copy)
    m = extract_model_from_parallel(copy.deepcopy(model), keep_fp32_wrapper=False).float().cpu().eval()
    m.set_attn_implementation("eager")
    compute_every_token(m)  # whole layers: ORT's BERT fusion matches those (and its kernels are the fast path)
    ids = torch.full((2, 16), 5, dtype=torch.long)
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0  # one padded row, so the mask is traced as data, not as a constant
    types = torch.zeros_like(ids)
    types[:, 5:] = 1  # a second text, so the token types are traced as data too
    sample = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
    axes = {n: {0: "batch", 1: "sequence"} for n in names} | {"logits": {0: "batch"}}
    with torch.inference_mode(False), torch.no_grad(), _quiet():
        torch.onnx.export(m, (), str(path), kwargs={n: sample[n] for n in names}, input_names=names,
                          output_names=["logits"], dynamic_axes=axes, opset_version=OPSET, dynamo=False)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():  # tracer warnings about python branches on shapes: expected here
        warnings.simplefilter("ignore")
        yield


def _fuse(model: Any, raw: Path, out: Path) -> dict:
    """ORT's BERT fusions (python passes only, opt_level 0: the session applies its own at load time)."""
    from onnxruntime.transformers import optimizer

    cfg = model.config
    with _quiet():
        fused = optimizer.optimize_model(str(raw), model_type="bert", num_heads=cfg.num_attention_heads,
                                         hidden_size=cfg.hidden_size, opt_level=0)
    stats = {k: v for k, v in fused.get_fused_operator_statistics().items() if v}
    if stats.get("Attention", 0) < cfg.num_hidden_layers:
        raise _fail(f"fused {stats.get('Attention', 0)} of {cfg.num_hidden_layers} attention layers of "
                    f"{type(model).__name__}")
    fused.save_model_to_file(str(out))
    return stats


def _quantize(fused: Path, out: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # the fused com.microsoft ops defeat ONNX shape inference; their outputs are float32. The quantizer
    # logs a root-logger WARNING advising pre-processing (for static quantization of CNNs): not ours to act on
    root = logging.getLogger()
    level = root.level
    root.setLevel(max(level, logging.ERROR))
    try:
        quantize_dynamic(str(fused), str(out), weight_type=QuantType.QInt8, per_channel=PER_CHANNEL,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    finally:
        root.setLevel(level)


def export(model: Any, precision: str, folder: Path) -> dict:
    """Export + fuse (+ quantize) `model` into `folder` (which must hold no export yet); its summary."""
    check_exportable(model)
    names, start = input_names(model), time.perf_counter()
    _export_torch(model, names, folder / "exported.onnx")
    exported_s = time.perf_counter() - start
    fused = folder / (MODEL_FILE if precision == "fp32" else "fused.onnx")
    stats = _fuse(model, folder / "exported.onnx", fused)
    if precision == "int8":
        _quantize(fused, folder / MODEL_FILE)
    for p in folder.iterdir():
        if p.name != MODEL_FILE:
            p.unlink()
    info = {"precision": precision, "inputs": names, "fused": stats, "per_channel": PER_CHANNEL,
            "export_seconds": round(exported_s, 2), "total_seconds": round(time.perf_counter() - start, 2),
            "versions": package_versions()}
    return info


def cached(model: Any, precision: str, folder: Path) -> tuple[Path, bool]:
    """(model file, reused?): the complete export in `folder`, checked against its manifest (every file's size
    and sha256) before use; written atomically first when there is none, or again when it does not match
    (an edited or truncated model.onnx is exported anew, never scored)."""
    reason = artifacts.check_files(folder) if artifacts.is_complete(folder) else None
    if artifacts.is_complete(folder) and reason is None:
        return folder / MODEL_FILE, True
    if reason is not None:
        print(f"warning: the cached ONNX export {folder} does not match its manifest ({reason}); exporting it again",
              file=sys.stderr, flush=True)
    if folder.parent.is_dir():  # a half-written export that a killed process left is never read, only removed
        artifacts.remove_stale_temporaries(folder.parent)
    try:
        with artifacts.atomic_dir(folder, replace=reason is not None) as tmp:
            info = export(model, precision, tmp)
            artifacts.write_files_manifest(tmp, kind="onnx", **info)
    except FileExistsError:  # another process of this evaluation finished the same export first
        return folder / MODEL_FILE, True
    stem = folder.name.rpartition("-")[0] + "-"  # <checkpoint name>-<precision>-: the same checkpoint's older weights
    for stale in folder.parent.glob(f"{stem}*"):
        if stale != folder and stale.is_dir() and stale.name.rpartition("-")[0] + "-" == stem:
            shutil.rmtree(stale, ignore_errors=True)  # a derived cache no weights match any more
    return folder / MODEL_FILE, False


@contextlib.contextmanager
def scratch_dir(parent: Path) -> Iterator[Path]:
    """A locked temporary folder in `parent` (named like atomic_dir's, so remove_stale_temporaries
    clears one that a killed process left), removed on exit."""
    parent.mkdir(parents=True, exist_ok=True)
    artifacts.remove_stale_temporaries(parent)
    tmp = parent / f".onnx-export.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    lock = os.open(tmp, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield tmp
    finally:
        os.close(lock)
        shutil.rmtree(tmp, ignore_errors=True)


class OrtClassifier:
    """An InferenceSession that predict_logits calls like the torch model: model(**inputs).logits."""

    def __init__(self, path: Path, config: Any, names: list[str], reused: bool):
        import onnxruntime as ort
        import torch

        options = ort.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.config, self.names, self.reused = config, names, reused

    def __call__(self, **inputs: Any) -> SimpleNamespace:
        import torch

        ids = inputs["input_ids"]
        feeds = {n: (inputs[n] if n in inputs else torch.zeros_like(ids)).cpu().numpy() for n in self.names}
        return SimpleNamespace(logits=torch.from_numpy(self.session.run(["logits"], feeds)[0]))  # (batch, labels)


def session_for(model: Any, precision: str, onnx_dir: Path | None = None) -> OrtClassifier:
    """The ORT classifier of `model` at `precision`: from/into the cache folder `onnx_dir`; else exported in
    full into a temporary folder of tempfile's, gone once the session has loaded it (validation's sessions
    come from the run's template instead: onnx_template.session)."""
    check_exportable(model)
    names = input_names(model)
    if onnx_dir is not None:
        path, reused = cached(model, precision, Path(onnx_dir))
        return OrtClassifier(path, model.config, names, reused)
    import tempfile

    with scratch_dir(Path(tempfile.gettempdir())) as tmp:
        export(model, precision, tmp)
        return OrtClassifier(tmp / MODEL_FILE, model.config, names, reused=False)
