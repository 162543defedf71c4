"""LoRA through peft: the model wrapped with adapters, checkpoints that hold only what trains, and the exports.

With `peft.method=lora` the pretrained weights are frozen; what trains is the adapters (each a pair A (r x in),
B (out x r) beside a layer, the update scaled by alpha / r) and, for a classifier, its new head, which is
always trained and saved (a head left out of the adapter is peft's best-known way to reload a model with a
random head). The rest of the project sees a model like any other; four things differ, all here:

- checkpoints: accelerate's save_state writes `get_state_dict(model)`, the frozen base included. A save hook
  keeps only the trained tensors, under the keys of the wrapped model; a load hook reads them back itself,
  refusing a file whose keys are not exactly this model's trained ones (peft #1453's missing
  `base_model.model...` keys are an error naming the key, never a model that silently keeps its fresh
  adapter). FSDP and DeepSpeed save through their own paths (shards of the whole model): no hook applies there.
- the base: a checkpoint records which base it adapts (`base_identity`: the name and a hash of its weights);
  a resume or an evaluation on another base is refused in one line naming both.
- final/: `adapter/` (peft's save_pretrained: loadable by `AutoPeftModelFor...`, with the labelled config
  and tokenizer beside it) and, by default, the adapter merged into the base: a plain transformers model.
- inference: evaluate.py merges the adapter into its base before predicting, so every runtime and precision
  (int8, ONNX) runs a plain model; the merged and unmerged outputs agree to 1e-5 (tested).
QLoRA (peft.quantize=nf4) loads the base in 4-bit through bitsandbytes on a CUDA GPU (`load_kwargs`); its
exports merge the adapters into the full-precision base.
"""

from __future__ import annotations

import contextlib
import hashlib
import warnings
from pathlib import Path
from typing import Any

from pipeline import artifacts

ADAPTER_DIR = "adapter"  # final/adapter/
ADAPTER_CONFIG = "adapter_config.json"  # peft's name, in final/adapter/ and the run's model_config/
WEIGHTS = "model.safetensors"  # accelerate's name for model 0's weights in a checkpoint


def check_config(cfg) -> None:
    """Before any work: LoRA adapts pretrained weights that can be loaded again from model.name_or_path."""
    if cfg.peft.quantize != "none" and cfg.peft.method == "none":
        raise ValueError(f"peft.quantize={cfg.peft.quantize} quantizes the frozen base of peft.method=lora (QLoRA); "
                         f"set peft.method=lora, or peft.quantize=none to train every weight")
    if cfg.peft.method == "none":
        return
    import importlib.util

    if importlib.util.find_spec("peft") is None:
        raise ValueError(f"peft.method={cfg.peft.method} needs peft: pip install -c constraints.txt -e '.[lora]'")
    if cfg.peft.quantize != "none" and importlib.util.find_spec("bitsandbytes") is None:
        raise ValueError(f"peft.quantize={cfg.peft.quantize} (QLoRA) needs bitsandbytes and a CUDA GPU: "
                         f"pip install bitsandbytes")
    if cfg.model.from_scratch:
        raise ValueError(f"peft.method={cfg.peft.method} adapts a pretrained model, but model.from_scratch="
                         f"{cfg.model.from_scratch} builds a random one; train it in full (peft.method=none)")
    if cfg.train.init_from:
        raise ValueError(f"peft.method={cfg.peft.method} with train.init_from={cfg.train.init_from}: adapters need "
                         f"their base where they can be loaded again; set model.name_or_path to that run's final/ "
                         f"instead")


def load_kwargs(cfg) -> dict:
    """from_pretrained's extra arguments for the base model: with peft.quantize=nf4 (QLoRA: Dettmers et al.
    2023), its weights in 4-bit NormalFloat, double-quantized, computed in bf16, on this process's GPU."""
    if cfg.peft.quantize == "none":
        return {}
    import os

    import torch
    from transformers import BitsAndBytesConfig

    if not torch.cuda.is_available():
        raise ValueError(f"peft.quantize={cfg.peft.quantize} (QLoRA) needs a CUDA GPU: bitsandbytes' 4-bit kernels "
                         f"run there only, and none is visible; use peft.quantize=none")
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=cfg.peft.quantize,
                               bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=torch.bfloat16)
    return {"quantization_config": quant, "device_map": {"": int(os.environ.get("LOCAL_RANK", "0"))}}


def adapt(cfg, task, model, acc=None) -> tuple[Any, dict | None]:
    """(the model, None) for peft.method=none; else (the model with adapters, the base it adapts: base_identity).
    With `acc`, the accelerator then saves and loads only what trains (keep_trained, load_trained_hook)."""
    if cfg.peft.method == "none":
        return model, None
    head = task.head(model) if task.head else []
    base = base_identity(model, cfg.model.name_or_path, head, cfg.peft.quantize)
    conf = lora_config(cfg.peft, task.peft_task_type, head, model.name_or_path)  # the folder it loaded from
    if cfg.peft.quantize != "none":  # QLoRA: norms in fp32, inputs that require grad (peft's recipe)
        from peft import prepare_model_for_kbit_training

        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=cfg.train.gradient_checkpointing,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})
    model = wrap(model, conf)
    if acc is not None:
        acc.register_save_state_pre_hook(keep_trained)
        acc.register_load_state_pre_hook(load_trained_hook)
    return model, base


def is_adapted(model) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")


def base_identity(model, name: str, head: list[str], quantize: str = "none") -> dict:
    """The base a run adapts: its configured name and a sha256 over every tensor of the pretrained model
    (keys, dtypes, shapes, bytes), leaving out the new head (`head`: module names), whose initial values
    are the seed's, not the base's; `quantize`: peft.quantize, the form the hashed weights were in.
    ~0.3 s for 135 M fp32 parameters."""
    import torch

    digest = hashlib.sha256()
    for key, t in sorted(model.state_dict().items()):
        if key.split(".")[0] in head:
            continue
        t = t.detach().cpu().contiguous().reshape(-1)
        digest.update(f"{key}|{t.dtype}|{t.numel()}|".encode())
        digest.update(memoryview(t.view(torch.uint8).numpy()))
    return {"name": name, "weights": digest.hexdigest()[:16], "head": sorted(head), "quantize": quantize}


def describe_base(identity: dict | None) -> str:
    return f"{identity['name']} (weights {identity['weights']})" if identity else "no recorded base (peft.method=none)"


def lora_config(section, task_type: str, head: list[str], base_path: str | None):
    """peft's LoraConfig of the `peft` section; target_modules empty = peft's default for the model type;
    `base_path`: where the base loads from (peft records the model's own name_or_path there in any case)."""
    from peft import LoraConfig

    return LoraConfig(r=section.r, lora_alpha=section.alpha, lora_dropout=section.dropout,
                      target_modules=list(section.target_modules) or None, task_type=task_type or None,
                      modules_to_save=sorted({*head, *section.modules_to_save}) or None,
                      base_model_name_or_path=base_path)


def wrap(model, config) -> Any:
    """The model with adapters (peft.get_peft_model); an architecture peft has no default layers for, or
    a target that matches nothing, is one line naming peft.target_modules and the layers there are."""
    from peft import get_peft_model

    try:
        with _quiet():
            return get_peft_model(model, config)
    except ValueError as e:
        import torch

        kinds = (torch.nn.Linear, torch.nn.Embedding, torch.nn.Conv1d)
        names = sorted({n.split(".")[-1] for n, m in model.named_modules()
                        if isinstance(m, kinds) or type(m).__name__ == "Conv1D"})
        raise ValueError(f"peft.target_modules={list(config.target_modules or [])}: {str(e).splitlines()[0][:200]} "
                         f"(model type {model.config.model_type}); name layers of this model, e.g. "
                         f"peft.target_modules=[{','.join(names[:8])}]") from None


@contextlib.contextmanager
def _quiet():
    """peft asks transformers' deprecated is_gradient_checkpointing (a FutureWarning each time), and sets
    fan_in_fan_out itself for GPT-2's Conv1D layers (the right value, said as a warning): neither is the user's."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*fan_in_fan_out is set to False.*")
        yield


def trained_names(model) -> set[str]:
    """State-dict keys of what trains (the adapters, the head), as the unwrapped model names them."""
    return {n for n, p in _unwrapped(model).named_parameters() if p.requires_grad}


def _unwrapped(model):
    from accelerate.utils import extract_model_from_parallel

    return extract_model_from_parallel(model, keep_fp32_wrapper=False)


def keep_trained(models: list, weights: list, output_dir: str) -> None:
    """accelerate's save_state pre-hook: each adapted model's weights cut down to what trains."""
    for i, (model, state) in enumerate(zip(models, weights)):
        if not is_adapted(_unwrapped(model)):
            continue
        names = trained_names(model)
        missing = sorted(names - set(state))
        if missing:  # the state dict is keyed otherwise than the model: saving would lose trained weights
            raise ValueError(f"adapter checkpoint {output_dir}: {missing[0]} is not in the model's state dict")
        weights[i] = {k: v for k, v in state.items() if k in names}


def load_trained_hook(models: list, input_dir: str) -> None:
    """accelerate's load_state pre-hook: adapted models are loaded here, strictly, and taken off the list
    accelerate then loads (it would load the adapter-only file non-strictly, or fail on the frozen keys)."""
    for model in [m for m in models if is_adapted(_unwrapped(m))]:
        load_trained(Path(input_dir), _unwrapped(model))
        models.remove(model)


def load_trained(folder: Path, model, weights: dict | None = None) -> None:
    """Load what trains into an adapted model: from `folder`'s model.safetensors, whose keys must be exactly
    the model's trained ones, or from `weights`, a full state dict of the same model (the final export)."""
    exact = weights is None
    where = str(folder / WEIGHTS) if exact else str(folder)
    if exact:
        from safetensors.torch import load_file

        if not (folder / WEIGHTS).is_file():
            raise ValueError(f"{folder} holds no {WEIGHTS}: not an adapter checkpoint of this project")
        weights = load_file(str(folder / WEIGHTS))
    names = trained_names(model)
    missing = sorted(names - set(weights))
    if missing:
        raise ValueError(f"{where} lacks {missing[0]} ({len(missing)} of the {len(names)} tensors this model trains): "
                         f"a checkpoint of other peft settings or another model; use the config it was made with")
    extra = sorted(set(weights) - names) if exact else []
    if extra:
        raise ValueError(f"{where} holds {extra[0]}, which this model does not train ({len(extra)} such tensors): "
                         f"a checkpoint of other peft settings or another model; use the config it was made with")
    own = model.state_dict()
    wrong = next((k for k in sorted(names) if tuple(own[k].shape) != tuple(weights[k].shape)), None)
    if wrong:
        raise ValueError(f"{where}: {wrong} has shape {tuple(weights[wrong].shape)}, this model's "
                         f"{tuple(own[wrong].shape)} (another peft.r or model)")
    model.load_state_dict({k: weights[k] for k in names}, strict=False)


def merged_copy(model):
    """A plain model of the adapter merged into a copy of its base (the training model is left as it is)."""
    import copy

    return copy.deepcopy(model).merge_and_unload()


def write_final(model, tok, out: Path, merge: bool) -> None:
    """Into the (temporary) final folder `out`: adapter/ (peft's files, the labelled config, the tokenizer,
    its own manifest), the config and tokenizer, and with `merge` the merged weights (model.safetensors)."""
    adapter = out / ADAPTER_DIR
    model.save_pretrained(str(adapter), safe_serialization=True)
    model.config.save_pretrained(str(adapter))  # the labels: AutoPeftModel...(adapter, id2label=...)
    tok.save_pretrained(str(adapter))
    artifacts.write_files_manifest(adapter, kind="adapter")
    if merge:
        model.merge_and_unload().save_pretrained(str(out), safe_serialization=True)
    else:
        model.config.save_pretrained(str(out))


def load_for_inference(folder: Path, config_dir: Path, auto_class, expected_base: dict | None,
                       load_weights=None) -> Any:
    """The merged plain model of an adapter: `folder` is an adapter folder (final/adapter: peft's files) or
    an adapter checkpoint (its trained tensors; `load_weights(folder, model)` reads one that save_state wrote
    otherwise, FSDP's shards), `config_dir` holds the labelled config.json and the adapter_config.json that
    names the base (the adapter folder itself, for one); the base's weights are checked against `expected_base`."""
    with _quiet():
        return _load_merged(folder, config_dir, auto_class, expected_base, load_weights)


def _load_merged(folder: Path, config_dir: Path, auto_class, expected_base: dict | None, load_weights) -> Any:
    from peft import LoraConfig, PeftModel
    from transformers import AutoConfig

    conf = LoraConfig.from_pretrained(str(config_dir))
    base_path = conf.base_model_name_or_path
    if expected_base and (not base_path or not Path(base_path).exists()):
        # the folder it loaded from is gone (a package reinstalled elsewhere, a GGUF cache cleared): the run's
        # model.name_or_path finds it again (package:..., a .gguf converted anew); the weights are checked below
        from pipeline.models.pretrained import resolve_pretrained

        base_path = resolve_pretrained(expected_base["name"])
    if not base_path or (Path(base_path).is_absolute() and not Path(base_path).exists()):
        raise FileNotFoundError(f"{config_dir / ADAPTER_CONFIG}: its base model {base_path!r} is not there; install "
                                f"or copy the base model back to that path")
    # output_loading_info: the head is the adapter's, so transformers' table of "newly initialised" keys is noise
    base, _ = auto_class.from_pretrained(base_path, config=AutoConfig.from_pretrained(str(config_dir)),
                                         output_loading_info=True)
    if expected_base:
        check_base(base_identity(base, expected_base["name"], expected_base.get("head", [])), expected_base, folder)
    if (folder / ADAPTER_CONFIG).is_file():
        model = PeftModel.from_pretrained(base, str(folder))
    else:
        model = wrap(base, conf)
        (load_weights or load_trained)(folder, model)
    return model.merge_and_unload().eval()


def check_base(have: dict, expected: dict | None, where: Path) -> None:
    """The base an adapter is put on (`have`: its base_identity) must be the one it was trained on (when that
    was recorded). A QLoRA run's record is of its 4-bit weights: a full-precision base cannot be compared with
    it (its resume can)."""
    if not expected or expected.get("quantize", "none") != "none":
        return
    if have["weights"] != expected["weights"]:
        raise ValueError(f"{where} adapts base model {describe_base(expected)}, but the base loaded now has "
                         f"weights {have['weights']}; use the base it was trained on")
