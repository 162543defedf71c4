"""Which checkpoint gets evaluated, loading it, and refusing a label set that is not the data's."""

import shutil

import pytest
import torch

from pipeline.evaluation import model as model_io
from pipeline.tasks.classification import evaluate as classification
from pipeline.tasks.classification.model import model_class


def test_names_resolve_to_the_right_folders(world):
    run = world.run_dir
    assert model_io.resolve_checkpoint(run, "final") == run / "final"
    assert model_io.resolve_checkpoint(run, "best") == run / "checkpoints" / "step-4"  # macro_f1 0.6 > 0.4
    assert model_io.resolve_checkpoint(run, "last") == run / "checkpoints" / "step-8"  # by step in state.json
    assert model_io.resolve_checkpoint(run, "step-8") == run / "checkpoints" / "step-8"
    assert model_io.resolve_checkpoint(run, str(run / "checkpoints" / "step-4")) == run / "checkpoints" / "step-4"


def test_a_checkpoint_loads_its_own_weights_into_model_config(world):
    from safetensors.torch import load_file

    ckpt = world.run_dir / "checkpoints" / "step-8"
    model = model_io.load_model(ckpt, world.run_dir, model_class())
    want = load_file(str(ckpt / "model.safetensors"))
    for key, value in model.state_dict().items():
        assert torch.equal(value, want[key]), key
    assert classification.model_label_names(model) == world.label_names
    assert model_io.checkpoint_step(ckpt) == 8


def test_missing_checkpoint_is_a_clear_error(world):
    with pytest.raises(FileNotFoundError, match="step-99"):
        model_io.resolve_checkpoint(world.run_dir, "step-99")
    shutil.rmtree(world.run_dir / "final")
    with pytest.raises(FileNotFoundError, match="final"):
        model_io.resolve_checkpoint(world.run_dir, "final")


def test_incomplete_checkpoint_is_refused(world):
    ckpt = world.run_dir / "checkpoints" / "step-8"
    (ckpt / "manifest.json").unlink()  # what a save killed half-way leaves
    with pytest.raises(ValueError, match="incomplete"):
        model_io.resolve_checkpoint(world.run_dir, "step-8")
    with pytest.raises(ValueError, match="incomplete"):
        model_io.load_model(ckpt, world.run_dir, model_class())


@pytest.mark.parametrize("name", ["final", "step-4"])
@pytest.mark.parametrize("where", ["tensor data", "header"])
def test_a_flipped_byte_is_refused_naming_the_file_never_scored(world, name, where):
    ckpt = model_io.resolve_checkpoint(world.run_dir, name)
    weights = ckpt / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) - 5 if where == "tensor data" else 12] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="model.safetensors does not match its sha256"):
        model_io.load_model(ckpt, world.run_dir, model_class())


def test_final_without_weights_is_refused(world):
    (world.run_dir / "final" / "model.safetensors").unlink()
    ckpt = model_io.resolve_checkpoint(world.run_dir, "final")
    with pytest.raises(FileNotFoundError, match="no model.safetensors"):
        model_io.load_model(ckpt, world.run_dir, model_class())


def test_label_mismatch_names_both_label_sets(world):
    model = model_io.load_model(world.run_dir / "final", world.run_dir, model_class())
    with pytest.raises(ValueError, match=r"\['negative', 'neutral', 'positive'\].*\['neg', 'pos'\]"):
        classification.check_labels(model, ["neg", "pos"], world.run_dir / "final")
    classification.check_labels(model, world.label_names, world.run_dir / "final")  # same set: no error
