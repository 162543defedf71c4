"""eval.runtime=onnxruntime: the ONNX export matches torch, int8 keeps the predictions, the cache is
reused and invalidated by the weights, a failed export leaves nothing behind, validation exports once
per run and scores exactly what a full export does, and the config and model checks are one clear
line. Exports are slow-ish (~5-15 s each on 2 loaded cores), so tests share them where they can."""

import json

import datasets
import numpy as np
import pytest
import torch
from accelerate import Accelerator
from safetensors.torch import save_file
from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

from pipeline import artifacts
from pipeline.checks import load_config
from pipeline.config import ConfigError
from pipeline.inference import backends, onnx_export, onnx_template, predict
from pipeline.tasks import classification as _classification
from pipeline.training import checkpoint
from tests.accelkit import reset

pytest.importorskip("onnxruntime")


def _acc() -> Accelerator:
    """A CPU accelerator, made where it is used: accelerate's state is process-wide, and a test that ran before in
    this process may have reset it (tests/accelkit.py), which leaves an accelerator made earlier without one."""
    reset()
    return Accelerator(cpu=True)

CLASSIFICATION = _classification.TASK


def _final(world):
    return AutoModelForSequenceClassification.from_pretrained(world.run_dir / "final").eval()


def _test_split(world):
    return datasets.load_from_disk(str(world.stage_dir / "data"))["test"]


@pytest.fixture
def counted(monkeypatch):
    """The number of exports made (onnx_export.export calls)."""
    calls = []
    real = onnx_export.export

    def export(*args, **kwargs):
        calls.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(onnx_export, "export", export)
    return calls


def test_fp32_logits_equal_torch_within_1e_4_and_the_graph_is_fused(world, tmp_path, counted):
    model, ds = _final(world), _test_split(world)
    torch_logits = predict.predict_logits(model, ds, 4, _acc(), progress=False)
    folder = tmp_path / "onnx"
    ort_logits = predict.predict_logits(model, ds, 4, _acc(), progress=False, runtime="onnxruntime", onnx_dir=folder)
    assert ort_logits.shape == (13, 3)  # 13 rows of 3-8 tokens in batches of 4: dynamic batch and sequence
    assert np.abs(ort_logits - torch_logits).max() < 1e-4
    info = artifacts.read_json(folder / artifacts.MANIFEST)
    assert info["fused"]["Attention"] == 2 and info["fused"]["SkipLayerNormalization"] == 4
    assert info["inputs"] == ["input_ids", "attention_mask", "token_type_ids"] and counted == ["fp32"]
    assert sorted(p.name for p in folder.iterdir()) == [artifacts.MANIFEST, onnx_export.MODEL_FILE]


def _trained_tiny_bert(seed: int = 0):
    """A 2-layer BERT trained for a few seconds on token-id documents whose class is the token group
    most of their tokens come from; (model, dataset of 300 held-out documents, their labels)."""
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)

    def documents(n):
        labels = rng.integers(0, 3, n)
        docs = []
        for c in labels:
            length = int(rng.integers(8, 48))
            own = rng.integers(10 + 20 * c, 30 + 20 * c, length)  # the class's tokens
            noise = rng.integers(10, 70, length)
            docs.append([2, *np.where(rng.random(length) < 0.45, own, noise).tolist(), 3])
        return docs, labels

    model = BertForSequenceClassification(BertConfig(
        vocab_size=80, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=64, num_labels=3, pad_token_id=0))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    from pipeline.inference.padding import pad

    for _ in range(120):
        docs, labels = documents(32)
        loss = model(**pad(docs, 0), labels=torch.as_tensor(labels)).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    docs, labels = documents(300)
    return model.eval(), datasets.Dataset.from_dict({"input_ids": docs}), labels


@pytest.mark.slow  # trains a model for seconds; int8 exports in the fast tier: the cache tests below
def test_int8_predictions_agree_with_fp32_on_most_rows_of_a_trained_model():
    model, ds, labels = _trained_tiny_bert()
    fp32 = predict.predict_logits(model, ds, 32, _acc(), progress=False, runtime="onnxruntime")
    int8 = predict.predict_logits(model, ds, 32, _acc(), "int8", progress=False, runtime="onnxruntime")
    assert np.mean(fp32.argmax(1) == labels) > 0.9  # it learned the task: its predictions mean something
    assert not np.allclose(int8, fp32, atol=1e-4)  # int8 ran, not fp32 again
    agree = np.mean(int8.argmax(1) == fp32.argmax(1))
    assert agree >= 0.95, f"int8 kept {agree:.1%} of fp32's predictions"


def test_the_cache_is_reused_and_changed_weights_export_again(world, counted):
    ckpt = world.run_dir / "checkpoints" / "step-4"
    model, ds = AutoModelForSequenceClassification.from_pretrained(world.run_dir / "final").eval(), _test_split(world)
    checkpoint.load_weights(ckpt, model)
    folder = onnx_export.cache_dir(ckpt, model, "int8")
    assert folder.parent == ckpt.parent / ".onnx"
    first = predict.predict_logits(model, ds, 4, _acc(), "int8", progress=False, runtime="onnxruntime", onnx_dir=folder)
    stamp = (folder / onnx_export.MODEL_FILE).stat().st_mtime_ns
    again = predict.predict_logits(model, ds, 4, _acc(), "int8", progress=False, runtime="onnxruntime", onnx_dir=folder)
    assert counted == ["int8"] and (folder / onnx_export.MODEL_FILE).stat().st_mtime_ns == stamp
    np.testing.assert_array_equal(first, again)
    assert onnx_export.cache_dir(ckpt, model, "fp32") != folder  # precision is part of the key
    # new weights in the same checkpoint folder (its manifest rewritten): a new key, a new export
    with torch.no_grad():
        model.classifier.weight.mul_(-1)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(ckpt / "model.safetensors"))
    checkpoint.write_manifest(ckpt, kind="checkpoint")
    changed = onnx_export.cache_dir(ckpt, model, "int8")
    assert changed != folder
    flipped = predict.predict_logits(model, ds, 4, _acc(), "int8", progress=False, runtime="onnxruntime", onnx_dir=changed)
    assert counted == ["int8", "int8"]
    assert np.abs(flipped - first).max() > 1e-3  # the new weights' logits, not the cached ones
    assert not folder.exists() and changed.is_dir()  # the old weights' export is gone: caches do not pile up
    other = onnx_export.cache_dir(world.run_dir / "final", model, "int8")
    assert other.parent == world.run_dir / ".onnx" and other.name.startswith("final-int8-")


# two kinds of damage in the fast tier, all four in the whole suite (each exports twice)
@pytest.mark.parametrize("damage", ["flip a byte", "truncate", pytest.param("extra file", marks=pytest.mark.slow),
                                    pytest.param("manifest without files", marks=pytest.mark.slow)])
def test_a_cached_export_that_does_not_match_its_manifest_is_exported_again_never_scored(world, counted, capsys,
                                                                                         damage):
    """An edited bias or a flipped byte in a cached model.onnx was reused (other scores, exit 0); a truncated
    one was an onnxruntime traceback on every later run, the broken cache never rebuilt."""
    ckpt = world.run_dir / "checkpoints" / "step-4"
    model, ds = AutoModelForSequenceClassification.from_pretrained(world.run_dir / "final").eval(), _test_split(world)
    checkpoint.load_weights(ckpt, model)
    folder = onnx_export.cache_dir(ckpt, model, "fp32")
    first = predict.predict_logits(model, ds, 4, _acc(), "fp32", progress=False, runtime="onnxruntime", onnx_dir=folder)
    onnx_file = folder / onnx_export.MODEL_FILE
    data = bytearray(onnx_file.read_bytes())
    if damage == "flip a byte":
        data[len(data) // 2] ^= 0xFF
        onnx_file.write_bytes(bytes(data))
    elif damage == "truncate":
        onnx_file.write_bytes(bytes(data[: len(data) // 3]))
    elif damage == "extra file":
        (folder / "model.onnx.data").write_bytes(b"external weights nobody vouched for")
    else:
        (folder / "manifest.json").write_text('{"kind": "onnx"}')
    capsys.readouterr()
    again = predict.predict_logits(model, ds, 4, _acc(), "fp32", progress=False, runtime="onnxruntime", onnx_dir=folder)
    assert counted == ["fp32", "fp32"]  # exported again
    assert f"warning: the cached ONNX export {folder} does not match its manifest (" in capsys.readouterr().err
    np.testing.assert_array_equal(first, again)
    assert artifacts.check_files(folder) is None  # the cache is whole again


def test_a_crash_mid_export_leaves_no_half_written_cache(world, tmp_path, monkeypatch):
    model, ds = _final(world), _test_split(world)
    folder = tmp_path / ".onnx" / "int8-key"
    left = tmp_path / ".onnx" / ".int8-key.tmp-999999999-deadbeef"  # what a process killed mid-export leaves
    left.mkdir(parents=True)
    (left / "exported.onnx").write_bytes(b"half")

    def crash(*_):
        raise RuntimeError("killed mid-quantization")

    monkeypatch.setattr(onnx_export, "_quantize", crash)
    with pytest.raises(RuntimeError, match="killed mid-quantization"):
        predict.predict_logits(model, ds, 4, _acc(), "int8", progress=False, runtime="onnxruntime", onnx_dir=folder)
    assert not folder.exists() and list((tmp_path / ".onnx").iterdir()) == []  # the dead writer's temporary too
    monkeypatch.undo()
    got = predict.predict_logits(model, ds, 4, _acc(), "int8", progress=False, runtime="onnxruntime", onnx_dir=folder)
    assert artifacts.is_complete(folder) and got.shape == (13, 3)


def test_validation_exports_into_the_run_dir_and_cleans_up(world):
    from pipeline.training.validation import validate

    model, ds = _final(world), _test_split(world)
    model.train()
    got = validate(_acc(), model, ds, 4, CLASSIFICATION, {"label_names": world.label_names}, "fp32", "onnxruntime", world.run_dir)
    want = validate(_acc(), model, ds, 4, CLASSIFICATION, {"label_names": world.label_names}, "fp32")
    assert model.training and model.config._attn_implementation != "eager"  # the training model is untouched
    assert got["loss"] == pytest.approx(want["loss"], abs=1e-5) and got["accuracy"] == want["accuracy"]
    # no export left behind: only the run's template (onnx_template), complete, in run/.onnx/
    assert [p.name for p in world.run_dir.iterdir() if "onnx" in p.name] == [".onnx"]
    [template] = (world.run_dir / ".onnx").iterdir()
    assert template.name.startswith(onnx_template.PREFIX) and artifacts.check_files(template) is None
    assert sorted(p.name for p in template.iterdir()) == [artifacts.MANIFEST, onnx_template.RECIPE, onnx_template.TEMPLATE]


@pytest.fixture
def traced(monkeypatch):
    """The number of TorchScript exports made (onnx_export._export_torch calls: a full export's, a probe's)."""
    calls = []
    real = onnx_export._export_torch

    def export_torch(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(onnx_export, "_export_torch", export_torch)
    return calls


def _nudge(model, generator):
    """New weights, as a training step leaves them (every parameter moves)."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator), alpha=0.05)
    model.train()


@pytest.mark.slow  # a full export per validation to compare with; the fast tier's template check: the next test
@pytest.mark.parametrize("precision", ["int8", "fp32"])
def test_validation_exports_once_per_run_and_scores_exactly_as_a_full_export(world, tmp_path, counted, traced,
                                                                            precision):
    """Issue 23: validation on ONNX Runtime exported, fused and quantized the model again at every validation
    (30 steps, validation every 2: 320 s). Now a run exports its graph once (two probes with random weights
    learn how its weight tensors are made); each validation only puts the weights in (+ int8 quantization)
    and scores exactly what a full export of the same weights scores, at every step."""
    from pipeline.training.validation import validate

    model, ds, info = _final(world), _test_split(world), {"label_names": world.label_names}
    run, generator, losses = tmp_path / "run", torch.Generator().manual_seed(0), []
    for validation in range(3):  # the first exports; the next two only put their weights in
        if validation:  # the first one scores the untrained model: LayerNorm ones, zero biases
            _nudge(model, generator)
        model.train()
        exports, traces = len(counted), len(traced)
        got = validate(_acc(), model, ds, 4, CLASSIFICATION, info, precision, "onnxruntime", run)
        if validation == 0:  # the two probes, and a full export: the exporter merges the equal tensors
            assert (len(counted) - exports, len(traced) - traces) == (1, 3)
        else:  # neither a full export nor a TorchScript trace
            assert (len(counted) - exports, len(traced) - traces) == (0, 0)
        fresh = validate(_acc(), model, ds, 4, CLASSIFICATION, info, precision, "onnxruntime")  # a full export
        assert got == fresh  # every metric, number for number
        np.testing.assert_array_equal(
            predict.predict_logits(model, ds, 4, _acc(), precision, progress=False, runtime="onnxruntime", scratch=run),
            predict.predict_logits(model, ds, 4, _acc(), precision, progress=False, runtime="onnxruntime"))
        losses.append(got["loss"])
    assert len(set(losses)) == 3  # each validation scored its own weights
    # the graph itself: byte for byte what a full export of these weights writes
    replayed, full = tmp_path / "replayed", tmp_path / "full"
    replayed.mkdir(), full.mkdir()
    path, reused = onnx_template.model_file(model, precision, run, replayed)
    onnx_export.export(model, precision, full)
    assert reused and path.read_bytes() == (full / onnx_export.MODEL_FILE).read_bytes()


def test_a_validation_template_that_does_not_match_its_manifest_is_built_again_never_used(world, tmp_path, counted,
                                                                                          traced, capsys):
    from pipeline.training.validation import validate

    model, ds, info = _final(world), _test_split(world), {"label_names": world.label_names}
    run = tmp_path / "run"
    _nudge(model, torch.Generator().manual_seed(1))
    validate(_acc(), model, ds, 4, CLASSIFICATION, info, "int8", "onnxruntime", run)
    assert counted == [] and len(traced) == 2  # the template's two probes
    folder = onnx_template.folder_for(model, run)
    recipe = artifacts.read_json(folder / onnx_template.RECIPE)
    some = next(iter(recipe["initializers"]))
    recipe["initializers"][some]["parts"][0][1] ^= True  # a recipe that would score other weights
    (folder / onnx_template.RECIPE).write_text(json.dumps(recipe))
    _nudge(model, torch.Generator().manual_seed(2))
    capsys.readouterr()
    got = validate(_acc(), model, ds, 4, CLASSIFICATION, info, "int8", "onnxruntime", run)
    assert len(traced) == 4  # built again
    assert f"warning: the ONNX validation template {folder} does not match its manifest (" in capsys.readouterr().err
    assert artifacts.check_files(folder) is None  # whole again
    assert got == validate(_acc(), model, ds, 4, CLASSIFICATION, info, "int8", "onnxruntime")


def test_a_model_whose_export_cannot_be_replayed_is_exported_at_every_validation(world, tmp_path, counted, capsys,
                                                                                 monkeypatch):
    from pipeline.training.validation import validate

    monkeypatch.setattr(onnx_template, "derive", lambda *_: (None, "its tensor X is made some other way"))
    model, ds, info = _final(world), _test_split(world), {"label_names": world.label_names}
    run = tmp_path / "run"
    _nudge(model, torch.Generator().manual_seed(1))
    validate(_acc(), model, ds, 4, CLASSIFICATION, info, "fp32", "onnxruntime", run)
    assert "every validation exports the model anew (its tensor X is made some other way)" in capsys.readouterr().err
    _nudge(model, torch.Generator().manual_seed(2))
    got = validate(_acc(), model, ds, 4, CLASSIFICATION, info, "fp32", "onnxruntime", run)
    assert counted == ["fp32", "fp32"]  # each validation exported in full, as before the template
    assert artifacts.read_json(onnx_template.folder_for(model, run) / artifacts.MANIFEST)["reusable"] is False
    assert got == validate(_acc(), model, ds, 4, CLASSIFICATION, info, "fp32", "onnxruntime")


def test_config_and_model_errors_are_one_line_naming_eval_runtime():
    for bad in (["eval.precision=bf16"], ["eval.bf16=true"]):
        with pytest.raises(ConfigError, match=r"^eval.runtime=onnxruntime runs eval.precision fp32 or int8, not bf16"):
            load_config(None, ["eval.runtime=onnxruntime", *bad])
    with pytest.raises(ConfigError, match="eval.runtime: 'openvino' is not one of 'torch', 'onnxruntime'"):
        load_config(None, ["eval.runtime=openvino"])
    assert load_config(None, ["eval.runtime=onnxruntime", "eval.precision=int8"]).eval.runtime == "onnxruntime"
    from transformers import GPT2Config, GPT2ForSequenceClassification

    gpt2 = GPT2ForSequenceClassification(GPT2Config(vocab_size=50, n_positions=16, n_embd=8, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match=r"^eval.runtime=onnxruntime: GPT2ForSequenceClassification \(model_type "
                                         r"'gpt2'\) cannot be exported .*; use eval.runtime=torch$"):
        backends.for_inference(gpt2, "fp32", torch.device("cpu"), "onnxruntime")
    with pytest.raises(ValueError, match="eval.runtime=onnxruntime runs on a CPU only"):
        backends.for_inference(gpt2, "int8", torch.device("cuda"), "onnxruntime")
