"""Validation during training with eval.runtime=onnxruntime: the run's fused graph, exported once, its
weights replaced at each validation.

Between two validations only the weights change, not the graph, yet every validation exported,
fused and quantized the model again: ~5 s of each MiniLM validation (issue 23). Now the run's first
validation (or train.max_minutes' measurement, in setup) makes a template: the fused fp32 graph, and a
recipe saying how each of its weight tensors is made from the model's tensors. Every validation puts
the current weights into the template by that recipe and, for int8, runs on it the same
`quantize_dynamic` a full export runs: what it scores is what a full export of these weights gives,
byte for byte (tests/inference/test_onnx_export.py compares the graphs and the scores).

The recipe is learned, not assumed. Two copies of the model whose every floating tensor (parameters,
float buffers) holds other random values, A and B, are exported and fused as a full export does.
Each weight tensor of A's fused graph must be one of A's tensors, its transpose, or a concatenation of
them (the fused Attention's q/k/v weights and biases): random values make the match unambiguous. The
recipe must then give B's tensors exactly from B's weights, the two graphs must be the same apart
from their weights, and every other tensor (shapes, epsilons) the same in both. If anything fails,
nothing is reused: the template's manifest says why, and each validation exports in full, as before.
One thing the values do change: the TorchScript exporter merges initializers with equal values into
one, so weights in which two tensors are equal (as at initialisation: LayerNorm ones, zero biases)
export to another graph. Each validation looks for such tensors (a hash of each) and, finding some,
exports in full; after a training step there are none.

Where: `<run dir>/.onnx/validation-<key>/` (template.onnx, recipe.json, manifest.json last), written
atomically; key = the model config, the names/shapes/dtypes of its tensors, the inputs, the opset and
the package versions. Every use checks the folder against its manifest (sizes and sha256); one that
does not match is built again with a warning, never used. A template of another key is removed when
a new one is written; `--restart` sets `run/.onnx/` aside with the rest of the run.
"""
from __future__ import annotations

import copy
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from pipeline import artifacts
from pipeline.inference import onnx_export

TEMPLATE = "template.onnx"
RECIPE = "recipe.json"
PREFIX = "validation-"
FORMAT = 1  # of recipe.json; part of the key


def sources(model: Any) -> dict[str, Any]:
    """name -> tensor: the model's parameters and floating buffers (each storage once), what an export's
    weights can be made of."""
    import torch
    from accelerate.utils import extract_model_from_parallel

    inner = extract_model_from_parallel(model, keep_fp32_wrapper=True, keep_torch_compile=False)  # no mutation
    out, seen = {}, set()
    for name, t in [*inner.named_parameters(), *inner.named_buffers()]:
        if t is None or not torch.is_floating_point(t) or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        out[name] = t
    return out


def _arrays(model: Any) -> dict[str, Any]:
    """The float32 values the export sees (it exports a .float() copy)."""
    return {k: t.detach().float().cpu().numpy() for k, t in sources(model).items()}


def key(model: Any) -> str:
    shapes = {k: [list(t.shape), str(t.dtype)] for k, t in sources(model).items()}
    return artifacts.fingerprint(FORMAT, model.config.to_json_string(), shapes, onnx_export.input_names(model),
                                 onnx_export.OPSET, onnx_export.package_versions())


def folder_for(model: Any, scratch: Path) -> Path:
    return Path(scratch) / ".onnx" / f"{PREFIX}{key(model)}"


def template(model: Any, scratch: Path) -> tuple[Path, dict]:
    """(folder, its manifest): the run's template for `model` under `scratch`, checked against its manifest;
    built first when there is none, or again (with a warning) when it does not match."""
    folder = folder_for(model, scratch)
    reason = artifacts.check_files(folder) if artifacts.is_complete(folder) else None
    if artifacts.is_complete(folder) and reason is None:
        return folder, artifacts.read_json(folder / artifacts.MANIFEST)
    if reason is not None:
        print(f"warning: the ONNX validation template {folder} does not match its manifest ({reason}); "
              f"exporting it again", file=sys.stderr, flush=True)
    if folder.parent.is_dir():  # a half-written template that a killed process left is never read, only removed
        artifacts.remove_stale_temporaries(folder.parent)
    try:
        with artifacts.atomic_dir(folder, replace=reason is not None) as out:
            recipe, why = derive(model, out)
            if recipe is None:
                print(f"note: eval.runtime=onnxruntime: every validation exports the model anew ({why})",
                      file=sys.stderr, flush=True)
            artifacts.write_files_manifest(out, kind="onnx-validation-template", reusable=recipe is not None,
                                           why=why, onnx_versions=onnx_export.package_versions())
    except FileExistsError:  # another process of this run wrote it first
        pass
    for stale in folder.parent.glob(f"{PREFIX}*"):
        if stale != folder and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)  # another model's template: no validation will use it
    return folder, artifacts.read_json(folder / artifacts.MANIFEST)


def model_file(model: Any, precision: str, scratch: Path, tmp: Path) -> tuple[Path, bool]:
    """(the model.onnx to score, made in `tmp`; from the template?): the run's template with `model`'s
    weights put in, or, where it cannot be used, a full export as before the template."""
    folder, info = template(model, scratch)
    path = replay(model, precision, folder, tmp) if info["reusable"] else None
    if path is not None:
        return path, True
    onnx_export.export(model, precision, tmp)
    return tmp / onnx_export.MODEL_FILE, False


def replay_seconds(model: Any, precision: str, scratch: Path) -> float:
    """What a validation pays before it predicts, once the run's template exists (it is built here first,
    untimed): these weights put in (+ int8 quantization) and the session loaded; a full export where the
    template cannot be used. For train.max_minutes, which measures before training: the weights are not
    checked for equal tensors (at initialisation there often are some, after a training step there are not)."""
    folder, info = template(model, scratch)
    with onnx_export.scratch_dir(Path(scratch)) as tmp:
        start = time.perf_counter()
        if info["reusable"]:
            path = replay(model, precision, folder, tmp, check=False)
        else:
            onnx_export.export(model, precision, tmp)
            path = tmp / onnx_export.MODEL_FILE
        onnx_export.OrtClassifier(path, model.config, onnx_export.input_names(model), reused=True)
        return time.perf_counter() - start


def _skeleton(proto: Any) -> bytes:
    """The model without its top-level weights' values (names, types, shapes kept)."""
    bare = copy.deepcopy(proto)
    for t in bare.graph.initializer:
        for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data",
                      "string_data", "external_data"):
            t.ClearField(field)
    return bare.SerializeToString(deterministic=True)


def _same(a: Any, b: Any) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _forms(arrays: dict[str, Any]) -> list[tuple[str, bool, Any]]:
    """(source, transposed, values): what a weight tensor of the export can be."""
    out = []
    for name, a in arrays.items():
        out.append((name, False, a))
        if a.ndim == 2:
            out.append((name, True, a.T))
    return out


def _match(target: Any, forms: list) -> dict | None:
    """{"axis", "parts"}: `target` as the concatenation of one or more forms along an axis, each part the
    only form with those values; None when there is no such way."""
    import numpy as np

    if target.dtype != np.float32 or target.size == 0:
        return None
    exact = [(n, tr) for n, tr, a in forms if _same(a, target)]
    if exact:
        return {"axis": 0, "parts": [list(exact[0])]} if len(exact) == 1 else None
    for axis in range(target.ndim):
        parts, at, size = [], 0, target.shape[axis]
        while at < size:
            found = [(n, tr, a) for n, tr, a in forms
                     if a.ndim == target.ndim and a.shape[axis] <= size - at
                     and all(a.shape[i] == target.shape[i] for i in range(a.ndim) if i != axis)
                     and _same(a, np.take(target, range(at, at + a.shape[axis]), axis=axis))]
            if len(found) != 1:
                break
            parts.append([found[0][0], found[0][1]])
            at += found[0][2].shape[axis]
        if at == size and len(parts) > 1:
            return {"axis": axis, "parts": parts}
    return None


def _build(how: dict, arrays: dict[str, Any]) -> Any:
    import numpy as np

    parts = [arrays[name].T if transposed else arrays[name] for name, transposed in how["parts"]]
    return np.ascontiguousarray(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=how["axis"]))


def _probe(model: Any, seed: int, out: Path) -> tuple[Any, dict[str, Any]]:
    """(fused graph, the float32 values it was made of): `model` with every source tensor random, exported
    and fused as a full export does, into `out/<seed>-*.onnx` (removed)."""
    import numpy as np
    import onnx
    import torch

    probe, rng = copy.deepcopy(model), np.random.default_rng(seed)
    with torch.no_grad():
        for t in sources(probe).values():
            t.copy_(torch.from_numpy(rng.standard_normal(tuple(t.shape), dtype=np.float32)))
    raw, fused = out / f"probe{seed}-exported.onnx", out / f"probe{seed}-fused.onnx"
    try:
        onnx_export._export_torch(probe, onnx_export.input_names(model), raw)
        onnx_export._fuse(probe, raw, fused)
        return onnx.load(str(fused)), _arrays(probe)
    finally:
        raw.unlink(missing_ok=True)
        fused.unlink(missing_ok=True)


def derive(model: Any, out: Path) -> tuple[dict | None, str]:
    """(recipe, "") with the template written to `out/TEMPLATE` and the recipe to `out/RECIPE`, learned from
    two exports of `model` with random weights (A, B: their weights never equal, so the exporter merges
    none); (None, why) when the fused graph cannot be made from the weights alone."""
    import onnx
    from onnx import numpy_helper

    try:
        a, a_values = _probe(model, 0, out)
        b, b_values = _probe(model, 1, out)
    except Exception as e:  # noqa: BLE001 - only the reuse is given up: each validation exports as before
        return None, f"its export with other weights failed: {type(e).__name__}: {e}"
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in a.graph.initializer):
        return None, "its export keeps weights in external data files"
    if _skeleton(a) != _skeleton(b):
        return None, "its exported graph is not the same for other weights"
    forms, made, constants = _forms(a_values), {}, []
    for ta, tb in zip(a.graph.initializer, b.graph.initializer):
        va, vb = numpy_helper.to_array(ta), numpy_helper.to_array(tb)
        how = _match(va, forms)
        if how is None:
            if not _same(va, vb):  # made from the weights some other way
                return None, f"its tensor {ta.name} is not a parameter, its transpose or a concatenation of them"
            constants.append(ta.name)  # the same for any weights: shapes, epsilons, ...
        elif not _same(_build(how, b_values), vb):
            return None, f"its tensor {ta.name} is not made from the weights the same way for other weights"
        else:
            made[ta.name] = how
    onnx.save(a, str(out / TEMPLATE))
    recipe = {"format": FORMAT, "initializers": made, "constants": constants}
    artifacts.write_json_atomic(out / RECIPE, recipe)
    return recipe, ""


def _set(tensor: Any, values: Any) -> None:
    """`tensor`'s data replaced by `values` (float32, its shape), kept in the field it was stored in."""
    import onnx

    if tensor.data_type != onnx.TensorProto.FLOAT or list(tensor.dims) != list(values.shape):
        raise RuntimeError(f"ONNX validation template: {tensor.name} is {list(tensor.dims)} "
                           f"(type {tensor.data_type}), the recipe makes {list(values.shape)}")
    if tensor.float_data:
        del tensor.float_data[:]
        tensor.float_data.extend(values.ravel().tolist())
    else:
        tensor.raw_data = values.astype("<f4", copy=False).tobytes()


def _equal_tensors(arrays: dict[str, Any], constants: list[tuple[str, Any]]) -> str | None:
    """Two weight tensors with equal values (or one equal to a float constant of the graph), named; else None.
    The TorchScript exporter merges equal initializers into one (in eval mode), so weights like those at
    initialisation (LayerNorm ones, zero biases) export to another graph than the template: a full export
    scores them. After a training step no two tensors are equal. Only tensors whose shape and first and
    last rows agree are compared in full (transposes as views: nothing the size of the weights is copied)."""
    import numpy as np

    def rows(a: Any) -> bytes:
        edge = a.reshape(1) if a.ndim == 0 else a if a.ndim == 1 else np.stack([a[0], a[-1]])
        return (np.asarray(edge, dtype=np.float64) + 0.0).tobytes()  # + 0.0: -0.0 and 0.0 are equal values

    groups: dict[tuple, list[tuple[str, Any]]] = {}
    candidates = [(f"the graph's constant {n}", v) for n, v in constants]
    for name, a in arrays.items():
        candidates += [(name, a), *([(f"{name} (transposed)", a.T)] if a.ndim == 2 else [])]
    for name, a in candidates:
        if a.size:
            groups.setdefault((a.shape, rows(a)), []).append((name, a))
    for group in groups.values():
        for i, (x, a) in enumerate(group):
            for y, b in group[i + 1:]:
                if not (x.startswith("the graph's") and y.startswith("the graph's")) and np.array_equal(a, b):
                    return f"{x} and {y}"
    return None


def replay(model: Any, precision: str, folder: Path, tmp: Path, check: bool = True) -> Path | None:
    """`tmp`/model.onnx: the template with `model`'s weights put in, quantized for int8 as a full export
    quantizes; None when `check` finds two equal weight tensors (`_equal_tensors`: a full export instead)."""
    import onnx
    from onnx import numpy_helper

    recipe = artifacts.read_json(folder / RECIPE)
    proto = onnx.load(str(folder / TEMPLATE))
    arrays = _arrays(model)
    by_name = {t.name: t for t in proto.graph.initializer}
    if check:
        constants = [(n, numpy_helper.to_array(by_name[n])) for n in recipe["constants"]]
        if _equal_tensors(arrays, [(n, v) for n, v in constants if v.dtype.kind == "f"]) is not None:
            return None
    for name, how in recipe["initializers"].items():
        _set(by_name[name], _build(how, arrays))
    fused = tmp / (onnx_export.MODEL_FILE if precision == "fp32" else "fused.onnx")
    onnx.save(proto, str(fused))
    if precision == "int8":
        onnx_export._quantize(fused, tmp / onnx_export.MODEL_FILE)
        fused.unlink()
    return tmp / onnx_export.MODEL_FILE


def session(model: Any, precision: str, scratch: Path) -> Any:
    """The ORT classifier of `model` at `precision` for a validation: the run's template (exported once per run,
    these weights put in) made into a temporary folder under `scratch` (the run directory), gone once loaded."""
    onnx_export.check_exportable(model)
    with onnx_export.scratch_dir(Path(scratch)) as tmp:
        path, reused = model_file(model, precision, Path(scratch), tmp)
        return onnx_export.OrtClassifier(path, model.config, onnx_export.input_names(model), reused)
