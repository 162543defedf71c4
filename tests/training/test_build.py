"""Bad input is a clear message before any work: precision traps, a model that does not fit the
tokenizer, zero steps, missing data, an output directory holding another run."""

from __future__ import annotations

import pytest

from pipeline import accel
from pipeline.checks import load_config
from pipeline.train import main
from pipeline.training import build, signals
from pipeline.training.loop import train
from tests.training.trainkit import run_dir


def test_fp16_without_gpu_and_slow_bf16_are_refused(monkeypatch, capsys):
    t = load_config(None, ["train.mixed_precision=fp16"]).train
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        build.choose_precision(t, "cpu")
    assert build.choose_precision(t, "cuda") == build.Precision("fp16", "fp16", "train.mixed_precision")
    monkeypatch.setattr(accel, "cpu_has_native_bf16", lambda: False)  # an AVX2-only CPU: bf16 emulated
    bf16 = load_config(None, ["train.mixed_precision=bf16"]).train
    with pytest.raises(ValueError, match="allow_slow_bf16"):
        build.choose_precision(bf16, "cpu")
    forced = load_config(None, ["train.mixed_precision=bf16", "train.allow_slow_bf16=true"]).train
    assert build.choose_precision(forced, "cpu").run == "bf16"
    assert "WARNING: bf16 forced" in capsys.readouterr().err
    monkeypatch.setattr(accel, "cpu_has_native_bf16", lambda: True)  # AVX512-BF16/AMX/Arm BF16: allowed, silent
    assert build.choose_precision(bf16, "cpu").run == "bf16"
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")  # what `accelerate launch` passes on
    with pytest.raises(ValueError, match="fp16 needs a GPU"):
        build.choose_precision(load_config(None).train, "cpu")


def test_model_that_does_not_fit_the_tokenizer(prepared, fresh_accelerate, tmp_path):
    from transformers import BertConfig, BertForSequenceClassification

    small = tmp_path / "small-bert"
    conf = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, num_labels=3)
    BertForSequenceClassification(BertConfig(vocab_size=50, **conf)).save_pretrained(small)
    config = prepared(model={"from_scratch": "", "name_or_path": str(small)})
    with pytest.raises(ValueError, match="the model embeds only 50"):
        train(load_config(config), str(config))
    short = tmp_path / "short-bert"
    BertForSequenceClassification(BertConfig(vocab_size=400, max_position_embeddings=16, **conf)).save_pretrained(short)
    with pytest.raises(ValueError, match="exceeds the model's 16 positions"):
        train(load_config(config, [f"model.name_or_path={short}"]), str(config))
    assert not run_dir(config).exists()  # nothing was written


def test_zero_steps_missing_data_and_existing_run(prepared, fresh_accelerate, tmp_path):
    config = prepared(train={"epochs": 1, "save_every": 0})
    with pytest.raises(ValueError, match="zero steps per epoch; lower train.batch_size"):
        main(["--config", str(config), "train.batch_size=200"])
    with pytest.raises(FileNotFoundError, match="python pipeline/prepare.py --config"):
        main(["--config", str(config), f"output_dir={tmp_path / 'elsewhere'}"])
    assert main(["--config", str(config)]) == signals.EXIT_OK
    with pytest.raises(FileExistsError, match="--resume auto"):
        main(["--config", str(config)])


def test_help_documents_resume_and_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "--resume auto|PATH" in out and "75 stopped by SIGTERM/SIGINT" in out


def test_attention_dropout_out_of_range_is_one_line():
    from pipeline.config import ConfigError

    with pytest.raises(ConfigError, match=r"model.attention_dropout=-0.5: give -1 .* or a dropout probability in \[0, 1\)"):
        load_config(None, ["model.attention_dropout=-0.5"])
    with pytest.raises(ConfigError, match="model.attention_dropout"):
        load_config(None, ["model.attention_dropout=1"])


def test_compile_needs_a_cpp_compiler_on_a_cpu_and_without_one_is_one_warning_and_eager_mode(monkeypatch, capsys):
    """train.compile on a CPU where inductor finds no C++ compiler: one warning and eager mode, not a failure at the
    first step; the compiled forward shares the model's parameters (checkpoints and final/ are the plain model's)."""
    import torch
    import torch._inductor.config as inductor

    assert build.can_compile(False, "cpu") is False
    monkeypatch.setattr(inductor.cpp, "cxx", ("no-such-c++-compiler",))
    assert build.can_compile(True, "cpu") is False
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "train.compile=true needs a C++ compiler" in err and "eager mode" in err
    monkeypatch.undo()
    assert build.can_compile(True, "cpu") is True and capsys.readouterr().err == ""
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    forward = build.compiled(model)
    assert forward is not model and list(forward.parameters())[0] is model[0].weight
    assert list(model.state_dict()) == ["0.weight", "0.bias"]
