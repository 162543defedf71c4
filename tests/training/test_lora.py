"""LoRA (peft.method=lora) runs: checkpoints of only what trains, a resume on another base refused, final/ (adapter
and merged model) read by evaluate.py, peft and transformers alike, gradient checkpointing and two processes,
int8 and ONNX Runtime scoring. The run they share trains once, in this process (nothing of it depends on being a
process of its own), as evaluate.py's runs here do (its main); what needs real processes (two ranks) forks them
from the zygote (trainkit). The kill/Ctrl-C/crash-in-save chains with LoRA, and bf16 autocast with LoRA, are in
test_resume_kill.py; FSDP with LoRA in test_checkpoint.py."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import signal

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from pipeline import tasks
from pipeline.checks import load_config
from pipeline.evaluation import model as model_io
from pipeline.models import lora
from pipeline.training import checkpoint, signals
from pipeline.training.loop import train
from tests.accelkit import reset
from tests.training.trainkit import (
    build_prepared,
    build_prepared_lm,
    clone_prepared,
    final_weights,
    fork_launch,
    fork_launch_ranks,
    log_text,
    records,
    run_dir,
    trajectory,
    wait_for_step,
    with_pretrained_base,
)
from tests.zygote import wait_ranks

# 160 rows, batch 8: 20 steps per epoch, 2 epochs
TRAIN = {"epochs": 2, "batch_size": 8, "lr": 1e-2, "log_every": 1, "eval_every": 10, "save_every": 5,
         "keep_last": 100, "keep_best": 1}


def _train(cfg, *overrides: str, resume: str | None = None) -> int:
    """train.py's run in this process (accelerate's singletons reset before and after)."""
    reset()
    try:
        return train(load_config(cfg, list(overrides)), str(cfg), resume)
    finally:
        reset()


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory):
    """A LoRA classifier on a tiny 'pretrained' BERT, trained once, uninterrupted, in this process; its stdout."""
    root = tmp_path_factory.mktemp("lora")
    cfg = with_pretrained_base(build_prepared(root, train=TRAIN))
    with contextlib.redirect_stdout(io.StringIO()) as out:
        assert _train(cfg) == signals.EXIT_OK
    return cfg, out.getvalue()


def _rows(cfg, n: int = 16) -> dict:
    from pipeline.data.prepared import load_prepared

    test = load_prepared(c := load_config(cfg), tasks.get(c.task), str(cfg)).splits["test"].select(range(n))
    ids = [torch.tensor(x) for x in test["input_ids"]]
    batch = torch.nn.utils.rnn.pad_sequence(ids, batch_first=True)
    return {"input_ids": batch, "attention_mask": (batch != 0).long()}


def test_checkpoints_hold_only_what_trains(lora_run):
    cfg, out = lora_run
    run = run_dir(cfg)
    assert "0.001 M of them trained" in out  # the describe line: what trains, of how much
    newest = checkpoint.complete_checkpoints(run / "checkpoints")[-1][0]
    saved = load_file(str(newest / "model.safetensors"))
    model = model_io.load_model(newest, run, _auto())  # merged for inference, so rebuild the adapted one here
    assert not lora.is_adapted(model)
    names = {k for k in saved}
    assert names and all(".lora_" in k or ".modules_to_save." in k for k in names), sorted(names)[:5]
    assert {k.split(".modules_to_save.")[0].rsplit(".", 1)[-1] for k in names if "modules_to_save" in k} == {"classifier"}
    optimizer = torch.load(newest / "optimizer.bin", weights_only=True)
    assert len(optimizer["state"]) == len(names)  # AdamW moments of the trained tensors only
    base_bytes = (cfg.parent / "base" / "model.safetensors").stat().st_size
    assert (newest / "model.safetensors").stat().st_size < 0.1 * base_bytes


def _auto():
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification


def test_final_adapter_merged_model_and_checkpoint_give_the_same_predictions(lora_run, capsys):
    """evaluate.py's three ways in (final/ merged, final/adapter, the last checkpoint) and peft's own
    AutoPeftModel (unmerged) agree to 1e-5; the merged final/ is a plain transformers model; evaluate.py's main
    scores the adapter folder (as a process: test_int8_and_onnx_runtime_score_a_merged_copy)."""
    from peft import AutoPeftModelForSequenceClassification
    from transformers import AutoConfig, AutoModelForSequenceClassification, pipeline

    from pipeline.evaluate import main as evaluate_main

    cfg, _ = lora_run
    run = run_dir(cfg)
    rows = _rows(cfg)
    merged = AutoModelForSequenceClassification.from_pretrained(run / "final").eval()
    assert not any("lora" in n for n, _ in merged.named_parameters())
    with torch.no_grad():
        want = merged(**rows).logits
        got = {name: model_io.load_model(model_io.resolve_checkpoint(run, name), run, _auto())(**rows).logits
               for name in ("final", str(run / "final" / "adapter"), "last")}
        adapter = run / "final" / "adapter"
        labels = AutoConfig.from_pretrained(adapter).id2label  # peft would build its base with 2 classes
        peft_model = AutoPeftModelForSequenceClassification.from_pretrained(adapter, id2label=labels).eval()
        got["peft"] = peft_model(**rows).logits
    assert want.std() > 1e-3  # the trained head and adapters make the rows differ
    for name, logits in got.items():
        assert torch.allclose(logits, want, atol=1e-5), (name, (logits - want).abs().max())
    clf = pipeline("text-classification", model=str(run / "final"), device="cpu")
    assert clf("w1 great w2")[0]["label"] in ("negative", "neutral", "positive")
    capsys.readouterr()
    reset()
    try:
        assert evaluate_main(["--config", str(cfg), "--split", "test", "--checkpoint", str(adapter), "--quiet"]) == 0
    finally:
        reset()
    assert "accuracy" in capsys.readouterr().out


def test_a_resume_on_another_base_is_refused_in_one_line(lora_run, tmp_path):
    """Another base path, or the same path holding other weights: one line naming both bases."""
    cfg, _ = lora_run
    mine = clone_prepared(cfg, tmp_path)
    shutil.copytree(cfg.parent / "base", tmp_path / "base")
    mine.write_text(mine.read_text().replace(str(cfg.parent / "base"), str(tmp_path / "base")))
    assert _train(mine, "train.max_steps=3") == signals.EXIT_OK
    with pytest.raises(ValueError) as e:
        _train(mine, "train.max_steps=6", f"model.name_or_path={cfg.parent / 'base'}", resume="auto")
    last = str(e.value)
    assert "\n" not in last and f"adapts base model {tmp_path / 'base'} (weights " in last, last
    assert f"the config's is {cfg.parent / 'base'} (other [model] settings" in last, last
    weights = load_file(str(tmp_path / "base" / "model.safetensors"))
    key = next(k for k in weights if "encoder.layer.0" in k and k.endswith("weight"))
    weights[key] = weights[key] + 1e-3
    save_file(weights, str(tmp_path / "base" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError) as e:
        _train(mine, "train.max_steps=6", resume="auto")
    last = str(e.value)
    assert "\n" not in last and last.count(f"{tmp_path / 'base'} (weights ") == 2, last
    assert "adapts base model" in last and "the config's is" in last, last


def test_other_peft_settings_are_refused_on_resume(lora_run, tmp_path):
    """Another rank, alpha or target is another run: refused by fingerprint, before anything loads."""
    cfg, _ = lora_run
    mine = clone_prepared(cfg, tmp_path)
    shutil.copytree(run_dir(cfg) / "checkpoints", run_dir(mine) / "checkpoints")
    for other in ("peft.r=8", "peft.method=none"):
        with pytest.raises(ValueError, match=r"other \[peft\] settings") as e:
            _train(mine, other, "train.epochs=3", resume="auto")
        assert "\n" not in str(e.value)


def _ranks_log(cfg, name: str) -> str:
    return "".join(log_text(cfg, f"{name}-{r}") for r in (0, 1))


@pytest.mark.slow
def test_gradient_checkpointing_and_two_processes_with_lora(lora_run, tmp_path):
    """Two processes at batch 4 with non-reentrant gradient checkpointing (the frozen embeddings make the
    reentrant variant fail with 'element 0 of tensors does not require grad') == one process at batch 8, to fp32
    tolerance; dropout is off in both. The ranks are forked from the zygote with the environment `accelerate
    launch` gives its workers (trainkit.fork_launch_ranks; the launcher itself: test_multiprocess.py)."""
    cfg, _ = lora_run
    one, two = clone_prepared(cfg, tmp_path / "one"), clone_prepared(cfg, tmp_path / "two")
    shutil.copytree(cfg.parent / "base", tmp_path / "base")  # the base without its dropout: ranks draw their own
    conf = json.loads((tmp_path / "base" / "config.json").read_text())
    (tmp_path / "base" / "config.json").write_text(json.dumps({**conf, "hidden_dropout_prob": 0.0}))
    same = ("peft.dropout=0.0", "train.max_steps=12", f"model.name_or_path={tmp_path / 'base'}")
    single = fork_launch(one, *same)
    multi = fork_launch_ranks(two, *same, "train.batch_size=4", "train.gradient_checkpointing=true")
    codes = wait_ranks([single, *multi])
    assert codes == [0, 0, 0], log_text(one)[-2000:] + _ranks_log(two, "multi")[-3000:]
    assert "2 process(es)" in log_text(two, "multi-0")
    a = [(r["step"], r["loss"]) for r in records(run_dir(one))]
    b = [(r["step"], r["loss"]) for r in records(run_dir(two))]
    assert [s for s, _ in a] == [s for s, _ in b] == list(range(1, 13))
    assert max(abs(x - y) for (_, x), (_, y) in zip(a, b)) <= 1e-5
    assert np.std([x for _, x in a]) > 1e-3
    wa, wb = final_weights(run_dir(one)), final_weights(run_dir(two))
    assert max((wa[k] - wb[k]).abs().max().item() for k in wa) <= 1e-5
    assert "does not require grad" not in _ranks_log(two, "multi")


@pytest.mark.slow
def test_two_process_lora_resume_after_sigkill_equals_the_uninterrupted_run(lora_run, tmp_path):
    """Both ranks SIGKILLed at once at step 8 (a power cut, mid-epoch: 20 steps per epoch; checkpoint at 5), resumed:
    == the uninterrupted pair, each rank's dropout masks included (one epoch: 20 steps)."""
    cfg, _ = lora_run
    ref, killed = clone_prepared(cfg, tmp_path / "ref"), clone_prepared(cfg, tmp_path / "killed")
    over = ("train.batch_size=4", "train.max_steps=20")
    reference = fork_launch_ranks(ref, *over)
    first = fork_launch_ranks(killed, *over, log_name="first")
    try:
        assert wait_for_step(first[0], run_dir(killed), 8), _ranks_log(killed, "first")[-3000:]
    finally:
        for p in first:  # SIGKILL to both ranks at once: a power cut
            p.kill()
    assert [p.wait(60) for p in first] == [-signal.SIGKILL] * 2
    resumed = fork_launch_ranks(killed, *over, "--resume", "auto", log_name="resumed")
    assert wait_ranks([*reference, *resumed]) == [0] * 4, _ranks_log(killed, "resumed")[-3000:]
    assert "resuming from" in log_text(killed, "resumed-0")
    assert trajectory(run_dir(killed)) == trajectory(run_dir(ref))
    a, b = final_weights(run_dir(killed)), final_weights(run_dir(ref))
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_causal_lm_lora_adapter_and_merged_model_score_the_same(tmp_path):
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoModelForCausalLM

    cfg = with_pretrained_base(build_prepared_lm(tmp_path, train={"epochs": 1, "eval_every": 0}),
                               {"merge_final": False})
    assert _train(cfg) == signals.EXIT_OK
    final = run_dir(cfg) / "final"
    assert not (final / "model.safetensors").exists() and (final / "adapter" / "adapter_config.json").is_file()
    assert checkpoint.is_final(final)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])
    with torch.no_grad():
        via_eval = model_io.load_model(model_io.resolve_checkpoint(run_dir(cfg), "final"), run_dir(cfg),
                                       AutoModelForCausalLM)(input_ids=ids).logits
        via_peft = AutoPeftModelForCausalLM.from_pretrained(final / "adapter").eval()(input_ids=ids).logits
    assert torch.allclose(via_eval, via_peft, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(cfg.parent / "base").eval()
    with torch.no_grad():
        assert (base(input_ids=ids).logits - via_peft).abs().max() > 1e-4  # the adapter changed something


@pytest.mark.slow  # ONNX export and ONNX Runtime: seconds
def test_int8_and_onnx_runtime_score_a_merged_copy(lora_run, tmp_path, capsys):
    """Quantization and ONNX export take a plain model: validation during a LoRA run and evaluate.py's main on a
    LoRA checkpoint score the adapter merged into its base, within int8's tolerance of the fp32 scores (in this
    process: nothing here depends on a process of its own; evaluate.py as a process: tests/evaluation)."""
    from pipeline.evaluate import main as evaluate_main

    cfg, _ = lora_run
    mine = clone_prepared(cfg, tmp_path)
    assert _train(mine, "train.max_steps=4", "train.eval_every=2", "eval.precision=int8") == signals.EXIT_OK
    evals = [r["eval"] for r in records(run_dir(mine), "eval")]
    assert [e["examples"] for e in evals] == [48, 48] and all(0 <= e["accuracy"] <= 1 for e in evals)
    scores = {}
    for runtime in ("torch", "onnxruntime"):
        capsys.readouterr()
        reset()
        try:
            assert evaluate_main(["--config", str(mine), "--quiet", "--split", "validation", "--checkpoint", "last",
                                  f"eval.runtime={runtime}"]) == 0
        finally:
            reset()
        assert "accuracy" in capsys.readouterr().out
        metrics = json.loads((run_dir(mine) / "eval" / "validation-last" / "metrics.json").read_text())
        assert metrics["runtime"] == runtime and metrics["step"] == 4
        scores[runtime] = metrics["chunk"]
    assert scores["torch"]["accuracy"] == scores["onnxruntime"]["accuracy"]
    assert abs(scores["torch"]["loss"] - scores["onnxruntime"]["loss"]) < 1e-4


def test_a_resume_after_the_last_step_exports_a_missing_final(lora_run, tmp_path, capsys):
    """A run killed between its last checkpoint and its export: --resume auto has no step left, and exports
    final/ (adapter and merged model) from that checkpoint."""
    cfg, _ = lora_run
    mine = clone_prepared(cfg, tmp_path)
    shutil.copytree(run_dir(cfg) / "checkpoints", run_dir(mine) / "checkpoints")
    assert _train(mine, resume="auto") == signals.EXIT_OK
    assert "nothing to do" in capsys.readouterr().out
    final = run_dir(mine) / "final"
    assert (final / "adapter" / "adapter_model.safetensors").is_file() and checkpoint.verify(final) is None
    a, b = final_weights(run_dir(mine)), final_weights(run_dir(cfg))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_an_adapter_whose_base_folder_moved_finds_it_by_the_runs_model_name(lora_run, tmp_path):
    """adapter_config.json names the folder the base loaded from; where that is gone (a package reinstalled,
    a GGUF cache cleared), evaluation resolves the run's model.name_or_path again, and checks its weights."""
    cfg, _ = lora_run
    final = shutil.copytree(run_dir(cfg) / "final", tmp_path / "final")
    conf = json.loads((final / "adapter" / "adapter_config.json").read_text())
    (final / "adapter" / "adapter_config.json").write_text(json.dumps({**conf, "base_model_name_or_path": "/gone/base"}))
    (final / "adapter" / "manifest.json").unlink()
    from pipeline import artifacts

    artifacts.write_files_manifest(final / "adapter", kind="adapter")
    rows = _rows(cfg)
    with torch.no_grad():
        got = model_io.load_model(final / "adapter", run_dir(cfg), _auto())(**rows).logits
        want = model_io.load_model(run_dir(cfg) / "final", run_dir(cfg), _auto())(**rows).logits
    assert torch.allclose(got, want, atol=1e-5)
    state = json.loads((final / "state.json").read_text())
    state["fingerprints"].pop("base")
    (final / "state.json").write_text(json.dumps(state))
    with pytest.raises(FileNotFoundError, match=r"its base model '/gone/base' is not there"):
        model_io.load_model(final / "adapter", run_dir(cfg), _auto())
