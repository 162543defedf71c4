"""`auto` precision, the default of train.mixed_precision and eval.precision: bf16 autocast where the device
computes bf16 natively, fp32 elsewhere; decided once, recorded, and kept on a resume. The detector is set
in-process (a /proc/cpuinfo of each kind), so these run alike on either kind of CI CPU."""

from __future__ import annotations

import json

import pytest
import torch

from pipeline import accel
from pipeline.checks import load_config
from pipeline.inference import backends
from pipeline.training import signals
from pipeline.training.build import Precision, choose_precision
from pipeline.training.loop import train
from tests.accelkit import reset
from tests.training.trainkit import clone_prepared, final_weights, run_dir

AVX2 = "avx2 fma"  # bf16 emulated
NATIVE = "avx2 avx512f avx512_bf16 avx512_vnni"
NO_BF16 = "auto: this CPU has no native bf16 (no avx512_bf16/amx_bf16)"


@pytest.fixture
def cpu(tmp_path, monkeypatch):
    """cpu(flags): from now on /proc/cpuinfo lists `flags` (the suite's pin of the detector lifted)."""
    monkeypatch.delenv(accel.NATIVE_BF16_VAR)
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)

    def kind(flags: str) -> None:
        (tmp_path / "cpuinfo").write_text(f"processor\t: 0\nmodel name\t: test\nflags\t\t: fpu sse2 {flags}\n")
        monkeypatch.setattr(accel, "CPUINFO", tmp_path / "cpuinfo")
    return kind


def test_auto_is_bf16_where_the_cpu_computes_it_and_fp32_elsewhere(cpu, monkeypatch):
    auto = load_config(None).train
    assert auto.mixed_precision == "auto" and load_config(None).eval.precision == "auto"
    cpu(AVX2)
    assert choose_precision(auto, "cpu") == Precision("no", "no", NO_BF16)
    cpu(NATIVE)
    assert choose_precision(auto, "cpu") == Precision("bf16", "bf16", "auto: CPU flags avx512_bf16")
    # explicit settings as before: no is fp32 on any CPU; empty is accelerate's setting as it is
    assert choose_precision(load_config(None, ["train.mixed_precision=no"]).train, "cpu").run == "no"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")  # what `accelerate launch` exports when nothing is set
    assert choose_precision(auto, "cpu").run == "bf16"
    assert choose_precision(load_config(None, ["train.mixed_precision=''"]).train, "cpu").run == "no"
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")  # set in accelerate's config or flags: it wins
    cpu(AVX2)
    with pytest.raises(ValueError, match="mixed precision bf16 refused: this CPU has no native bf16"):
        choose_precision(auto, "cpu")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    assert choose_precision(auto, "cuda") == Precision("fp16", "fp16", "accelerate's mixed_precision")


@pytest.mark.parametrize("capability, expected", [((8, 0), "bf16"), ((7, 5), "no")])
def test_auto_on_a_gpu_follows_its_capability(monkeypatch, capability, expected):
    """Ampere and later compute bf16; a T4 (7.5) only emulates it, so auto trains it in fp32."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: including_emulation or capability >= (8, 0))
    assert choose_precision(load_config(None).train, "cuda").run == expected
    assert backends.resolve(load_config(None).eval, "cuda")[0] == {"bf16": "bf16", "no": "fp32"}[expected]


def test_a_resume_keeps_the_first_launchs_choice_where_it_can(cpu):
    auto = load_config(None).train
    cpu(NATIVE)
    kept = "auto: kept from the run's first launch"
    assert choose_precision(auto, "cpu", recorded="no") == Precision("no", "no", kept)
    assert choose_precision(auto, "cpu", recorded="bf16") == Precision("bf16", "bf16", kept)
    cpu(AVX2)  # bf16 would be emulated, 15-20x slower: fp32, said, and the checkpoint's fingerprint kept
    moved = choose_precision(auto, "cpu", recorded="bf16")
    assert (moved.run, moved.kept) == ("no", "bf16")
    assert moved.why.startswith("auto: the run's first launch chose bf16, which this cpu does not compute natively "
                                "(this CPU has no native bf16") and "goes on in fp32" in moved.why
    assert choose_precision(auto, "cpu", recorded="fp16") == Precision("no", "fp16", moved.why.replace("bf16,", "fp16,"))


def test_evaluation_auto_is_the_devices_and_validation_follows_the_run(cpu):
    ev = load_config(None).eval
    cpu(NATIVE)
    assert backends.resolve(ev, "cpu") == ("bf16", "auto: CPU flags avx512_bf16")
    assert backends.resolve(ev, "cpu", trained="no") == ("fp32", "auto: as the run trains (no)")
    cpu(AVX2)
    assert backends.resolve(ev, "cpu") == ("fp32", NO_BF16)
    assert backends.resolve(ev, "cpu", trained="bf16") == ("bf16", "auto: as the run trains (bf16)")
    ort = load_config(None, ["eval.runtime=onnxruntime"]).eval
    assert backends.resolve(ort, "cpu") == ("fp32", "auto: ONNX Runtime runs fp32 or int8")
    assert backends.resolve(load_config(None, ["eval.precision=int8"]).eval, "cpu") == ("int8", "eval.precision")
    assert backends.resolve(load_config(None, ["eval.bf16=true"]).eval, "cpu")[0] == "bf16"


def _launches(config) -> list[dict]:
    return json.loads((run_dir(config) / "run_info.json").read_text())["launches"]


def _step(config, n: int) -> str:
    return str(run_dir(config) / "checkpoints" / f"step-{n:07d}")


@pytest.mark.slow  # bf16 training: emulated, many times slower, on CPUs without native bf16
def test_a_run_records_its_choice_and_a_resume_on_the_other_kind_of_cpu_keeps_it(prepared, fresh_accelerate, cpu,
                                                                                   tmp_path, capsys):
    from pipeline.evaluation.run import evaluate_checkpoint

    config = prepared(train={"epochs": 1, "save_every": 5, "keep_last": 4, "eval_every": 5})
    cpu(AVX2)
    assert train(load_config(config), str(config)) == signals.EXIT_OK
    (first,) = _launches(config)
    assert (first["mixed_precision"], first["mixed_precision_chosen_by"]) == ("no", NO_BF16)
    assert (first["eval_precision"], first["eval_precision_chosen_by"]) == ("fp32", "auto: as the run trains (no)")
    assert first["attention"] == "sdpa"  # the model's own
    assert f"precision no ({NO_BF16}); validation fp32" in capsys.readouterr().out

    # resumed at step 10 on a CPU with native bf16: it stays fp32 and ends bitwise where the run ended
    cpu(NATIVE)
    kept = clone_prepared(config, tmp_path / "kept")
    assert train(load_config(kept), str(kept), resume=_step(config, 10)) == signals.EXIT_OK
    (resumed,) = _launches(kept)
    assert (resumed["mixed_precision"], resumed["eval_precision"]) == ("no", "fp32")
    assert resumed["mixed_precision_chosen_by"] == "auto: kept from the run's first launch"
    ref, got = final_weights(run_dir(config)), final_weights(run_dir(kept))
    assert all(torch.equal(ref[k], got[k]) for k in ref)

    # a fresh run on that CPU trains and validates in bf16, and evaluate.py's auto is bf16 there
    bf16 = clone_prepared(config, tmp_path / "bf16")
    reset()  # accelerate's process-wide state holds one mixed precision; a new launch is a new process
    assert train(load_config(bf16), str(bf16)) == signals.EXIT_OK
    (launch,) = _launches(bf16)
    assert (launch["mixed_precision"], launch["eval_precision"]) == ("bf16", "bf16")
    assert launch["mixed_precision_chosen_by"] == "auto: CPU flags avx512_bf16"
    assert launch["attention"] == "eager"  # train.attention=auto: a classifier in bf16 on a CPU
    exported = json.loads((run_dir(bf16) / "final" / "config.json").read_text())
    assert exported.get("_attn_implementation", "sdpa") != "eager"  # a training choice, not the export's
    metrics = evaluate_checkpoint(load_config(bf16), str(bf16), progress=False)
    assert (metrics["precision"], metrics["precision_chosen_by"]) == ("bf16", "auto: CPU flags avx512_bf16")

    # and resumed on an AVX2-only CPU it goes on in fp32 (not emulated bf16), says so, and is not the bf16 run
    cpu(AVX2)
    capsys.readouterr()
    moved = clone_prepared(config, tmp_path / "moved")
    reset()
    assert train(load_config(moved), str(moved), resume=_step(bf16, 10)) == signals.EXIT_OK
    assert "warning: precision no: auto: the run's first launch chose bf16" in capsys.readouterr().err
    (launch,) = _launches(moved)
    assert (launch["mixed_precision"], launch["eval_precision"]) == ("no", "fp32")
    ref, got = final_weights(run_dir(bf16)), final_weights(run_dir(moved))
    assert not all(torch.equal(ref[k], got[k]) for k in ref)
    metrics = evaluate_checkpoint(load_config(moved), str(moved), progress=False)
    assert (metrics["precision"], metrics["precision_chosen_by"]) == ("fp32", NO_BF16)


def test_train_attention_auto_is_eager_only_for_a_classifier_in_bf16_on_a_cpu():
    from pipeline.training.build import training_attention

    assert training_attention("auto", "bf16", "cpu", cpu_bf16="eager") == "eager"
    assert training_attention("auto", "no", "cpu", cpu_bf16="eager") is None  # fp32: SDPA as fast here
    assert training_attention("auto", "bf16", "cuda", cpu_bf16="eager") is None
    assert training_attention("auto", "bf16", "cpu", cpu_bf16="") is None  # LM tasks keep theirs
    assert training_attention("sdpa", "bf16", "cpu", cpu_bf16="eager") == "sdpa"
    assert training_attention("eager", "no", "cpu", cpu_bf16="") == "eager"
    from pipeline import tasks

    assert {n: t.cpu_bf16_attention for n, t in tasks.TASKS.items()} == {
        "classification": "eager", "multilabel": "eager", "regression": "eager", "causal_lm": "", "instruct": ""}
