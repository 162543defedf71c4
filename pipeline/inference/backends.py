"""What inference runs: the precision (fp32, bf16 autocast, int8 dynamic quantization) and the
runtime (torch, or ONNX Runtime: onnx_export.py).

One place decides it for `evaluate.py` and for validation during training (both go through
`predict.predict_logits`), so the two cannot disagree about what a number was computed in.

- fp32: the model as trained. Attention is the model's own implementation (transformers 5 loads
  BERT with SDPA, measured ~1.4x eager at max_length 256 on this CPU: bench/results/inference.md).
- bf16: autocast. Native on CPUs with AVX512-BF16/AMX (pipeline.accel.cpu_has_native_bf16) and on
  most GPUs; elsewhere torch emulates it, many times slower than fp32, so it warns and still runs.
- int8: `torch.ao.quantization.quantize_dynamic` of the encoder's nn.Linear layers on a copy of
  the model (weights int8 per output channel, activations quantized per batch; fbgemm/x86 kernels).
  Per channel, not per tensor: on the trained MiniLM it kept 98.4% of fp32's tweet predictions
  against 97.5%, at the same speed. The classification head stays fp32: it is tiny and its
  outputs are the logits. CPU only.
  torch.ao.quantization is deprecated in favour of the separate torchao package; it still ships
  and works in torch 2.13 (its DeprecationWarning is silenced here, knowingly), and torchao is not
  a dependency of this project. The copy is made per call: during training the weights change
  between validations, and quantizing MiniLM takes well under a second.

The runtime (eval.runtime) is a second, orthogonal choice: `torch` runs the model as above;
`onnxruntime` runs an ONNX export of it, fused, in fp32 or int8 (its own quantizer; bf16 is refused
when the config loads). A separate key rather than more precision values because the two compose:
"int8" names the numbers either way, the runtime names the engine, and the report records both.
"""

from __future__ import annotations

import contextlib
import copy
import sys
import warnings
from typing import Any

PRECISIONS = ("fp32", "bf16", "int8")  # what runs; eval.precision may also be auto (resolve)
RUNTIMES = ("torch", "onnxruntime")
ORT_PRECISIONS = ("fp32", "int8")
_warned_deprecated = False


def precision_of(eval_cfg: Any) -> str:
    """eval.precision, with the deprecated eval.bf16=true read as precision bf16 (config validation
    refuses eval.bf16=true next to another precision). Says once per process that it is deprecated."""
    global _warned_deprecated
    if not getattr(eval_cfg, "bf16", False):
        return eval_cfg.precision
    if not _warned_deprecated:
        print("note: eval.bf16 is deprecated; it means eval.precision=bf16 (write that instead)", file=sys.stderr)
        _warned_deprecated = True
    return "bf16"


def resolve(eval_cfg: Any, device_type: str, trained: str | None = None) -> tuple[str, str]:
    """The precision eval.precision runs in on `device_type`, and why (for the log and metrics.json).

    auto: bf16 where the device computes bf16 natively (accel.native_bf16), fp32 elsewhere, and fp32 on ONNX
    Runtime (no bf16 there). Validation during training (`trained`: the run's mixed precision) follows the
    run instead, bf16 in a bf16 run and fp32 otherwise, so that a resume, which keeps the run's precision,
    keeps the validation that ranks its checkpoints too."""
    from pipeline import accel

    precision = precision_of(eval_cfg)
    if precision != accel.AUTO:
        return precision, "eval.precision"
    if eval_cfg.runtime == "onnxruntime":
        return "fp32", "auto: ONNX Runtime runs fp32 or int8"
    if trained is not None:
        return ("bf16" if trained == "bf16" else "fp32"), f"auto: as the run trains ({trained})"
    return ("bf16" if accel.native_bf16(device_type) else "fp32"), f"auto: {accel.why_precision(device_type)}"


def attention_of(model: Any) -> str:
    """The attention implementation the model runs ("sdpa", "eager", ...), for the report."""
    return str(getattr(model.config, "_attn_implementation", None) or "default")


def for_inference(model: Any, precision: str, device: Any, runtime: str = "torch",
                  onnx_dir: Any = None, scratch: Any = None) -> Any:
    """The model to run `precision` with: the model itself (fp32, bf16), an int8 copy, or (runtime
    onnxruntime) an ONNX Runtime session over its export, cached in `onnx_dir` when given, else made
    from the run's template under `scratch` (validation: onnx_template), else exported in a temporary
    folder (onnx_export.session_for, onnx_template.session)."""
    if precision not in PRECISIONS:
        raise ValueError(f"eval.precision: {precision!r} is not one of {', '.join(PRECISIONS)}")
    if runtime not in RUNTIMES:
        raise ValueError(f"eval.runtime: {runtime!r} is not one of {', '.join(RUNTIMES)}")
    if runtime == "onnxruntime":
        return _onnxruntime(model, precision, device, onnx_dir, scratch)
    if precision != "int8":
        return model
    if device.type != "cpu":
        raise ValueError(f"eval.precision=int8 runs on a CPU only (this run is on {device.type}); "
                         f"use eval.precision=bf16 or fp32 there")
    return quantize_int8(model)


def _onnxruntime(model: Any, precision: str, device: Any, onnx_dir: Any, scratch: Any) -> Any:
    # an error, not a CPU fallback: on a GPU machine a silent CPU session would be many times slower
    if device.type != "cpu":
        raise ValueError(f"eval.runtime=onnxruntime runs on a CPU only (this run is on {device.type}); "
                         f"use eval.runtime=torch there")
    if precision not in ORT_PRECISIONS:
        raise ValueError(f"eval.runtime=onnxruntime runs eval.precision fp32 or int8, not {precision}")
    if onnx_dir is None and scratch is not None:  # validation: the run's template, exported once per run
        from pipeline.inference import onnx_template

        return onnx_template.session(model, precision, scratch)
    from pipeline.inference import onnx_export

    return onnx_export.session_for(model, precision, onnx_dir)


def quantize_int8(model: Any) -> Any:
    """An eval-mode copy with every nn.Linear outside the classification head dynamically quantized."""
    import torch

    base = getattr(model, "base_model_prefix", "")
    body = getattr(model, base, None) if base else None
    if body is None or body is model:
        raise ValueError(f"eval.precision=int8: cannot find the encoder of {type(model).__name__} "
                         f"(base_model_prefix {base!r}); use eval.precision=fp32")
    names = {f"{base}.{n}" for n, m in body.named_modules() if isinstance(m, torch.nn.Linear)}
    if not names:  # GPT-2 uses transformers' Conv1D, not nn.Linear: nothing to quantize
        raise ValueError(f"eval.precision=int8: {type(model).__name__} has no nn.Linear layers to quantize; "
                         f"use eval.precision=fp32")
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():  # the deprecation of torch.ao.quantization and of qint8 tensors: see above
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*")
        return quantize_dynamic(copy.deepcopy(model).eval(), {n: per_channel_dynamic_qconfig for n in names},
                                dtype=torch.qint8)


def autocast(device: Any, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on `device` for precision bf16, warning loudly where it is slower than fp32."""
    import torch

    if precision != "bf16":
        return contextlib.nullcontext()
    from pipeline import accel

    if device.type == "cpu" and not accel.cpu_has_native_bf16():
        print(
            "WARNING: eval.precision=bf16 (or eval.bf16) on a CPU without native bf16 (no avx512_bf16/amx_bf16): "
            "torch emulates it, which is many times SLOWER than fp32 and slightly less accurate. "
            "Use eval.precision=int8 (fast) or fp32 here.",
            file=sys.stderr,
        )
    elif device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError("eval.precision=bf16: this GPU does not support bf16; use eval.precision=fp32")
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
