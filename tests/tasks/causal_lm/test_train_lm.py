"""Training a causal LM on the shared loop: a step's loss is the mean over all its target tokens, whatever the
micro-batches (gradient accumulation), and a resumed run equals one that never stopped."""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from pipeline import tasks
from pipeline.checks import load_config
from pipeline.data import runner
from pipeline.training import signals
from pipeline.training.loop import train
from tests.accelkit import reset

WORDS = [f"w{i}" for i in range(40)]


@pytest.fixture(scope="module")
def lm_config(tmp_path_factory) -> Path:
    """A folder of 40 short documents of very different lengths, prepared for task=causal_lm with blocks of 16
    tokens: many document boundaries per block, so micro-batches hold uneven numbers of targets."""
    root = tmp_path_factory.mktemp("lm")
    rng = random.Random(0)
    (root / "src" / "all").mkdir(parents=True)
    for i in range(40):
        lines = [" ".join(rng.choices(WORDS, k=rng.randint(1, 5))) for _ in range(rng.randint(1, 2))]
        (root / "src" / "all" / f"{i:02d}.txt").write_text("\n".join(lines), encoding="utf-8")
    tree = {
        "output_dir": str(root / "out"), "task": "causal_lm",
        "source": {"format": "folder", "path": str(root / "src"), "package": "", "label_field": ""},
        "clean": {"keep_lines": True}, "dedup": {"method": "none"},
        "split": {"train": 0.8, "validation": 0.1, "test": 0.1, "stratify": False},
        "tokenize": {"kind": "bpe", "vocab_size": 300, "min_frequency": 0},
        "lm": {"block_size": 16, "prompts": ["w1"], "sample_tokens": 4},
        "model": {"from_scratch": "gpt2", "hidden_size": 32, "num_layers": 2, "num_heads": 2,
                  "intermediate_size": 64, "dropout": 0.0},
        "train": {"epochs": 1, "batch_size": 8, "lr": 3e-3, "warmup_ratio": 0.0, "log_every": 1, "eval_every": 0,
                  "save_every": 0, "metric_for_best": "perplexity", "group_by_length": False},
        "eval": {"batch_size": 8},
    }
    config = root / "config.yaml"
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    runner.run(c := load_config(config), tasks.get(c.task), progress=False)
    return config


def _train(config: Path, out: Path, *extra: str, **train_overrides) -> dict[str, torch.Tensor]:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)  # in-process runs: no settings leak between them
    GradientState._reset_state()
    cfg = load_config(config, [f"output_dir={out}", *extra] + [f"train.{k}={v}" for k, v in train_overrides.items()])
    data = Path(load_config(config).output_dir) / "data"
    if not (out / "data").exists():
        out.mkdir(parents=True, exist_ok=True)
        shutil.copytree(data, out / "data", symlinks=True)
    assert train(cfg, str(config)) == signals.EXIT_OK
    return load_file(str(out / "run" / "final" / "model.safetensors"))


def _max_diff(a: dict, b: dict) -> float:
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def test_the_prepared_blocks_hold_uneven_target_counts(lm_config):
    from pipeline.data.prepared import load_prepared
    from pipeline.tasks.causal_lm.collate import Collator, loss_tokens

    prep = load_prepared(c := load_config(lm_config), tasks.get(c.task))
    rows = [prep.splits["train"][i] for i in range(8)]
    counts = [int(loss_tokens(Collator(0)(rows[i:i + 2]))) for i in range(0, 8, 2)]
    assert len(set(counts)) > 1, counts  # otherwise equal weights would pass the next test by chance


def test_a_batch_of_8_equals_4_micro_batches_of_2(lm_config, tmp_path, monkeypatch):
    whole = _train(lm_config, tmp_path / "whole", max_steps=3, batch_size=8, grad_accum=1)
    parts = _train(lm_config, tmp_path / "parts", max_steps=3, batch_size=2, grad_accum=4)
    assert _max_diff(whole, parts) < 2e-6
    # the control: each micro-batch's mean weighted alike (what the classification loop does) is not equal here
    unweighted = dataclasses.replace(tasks.TASKS["causal_lm"], loss_tokens=None)
    monkeypatch.setitem(tasks.TASKS, "causal_lm", unweighted)
    naive = _train(lm_config, tmp_path / "naive", max_steps=3, batch_size=2, grad_accum=4)
    assert _max_diff(whole, naive) > 1e-4


def test_a_run_resumed_from_its_step_checkpoint_equals_the_run_that_never_stopped(lm_config, tmp_path):
    """With validation and sampling at step 3 and 6 (sampling forks the RNG: it never moves training's)."""
    straight = _train(lm_config, tmp_path / "run", "model.dropout=0.1", max_steps=6, save_every=3, keep_last=5,
                      save_at_epoch_end=False, eval_every=3)
    samples = tmp_path / "run" / "run" / "samples"
    assert sorted(p.name for p in samples.iterdir()) == ["step-0000000.jsonl", "step-0000003.jsonl", "step-0000006.jsonl"]
    line = json.loads((samples / "step-0000006.jsonl").read_text(encoding="utf-8"))
    assert line["prompt"] == "w1" and line["text"].startswith("w1") and line["step"] == 6
    ckpts = tmp_path / "run" / "run" / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step-0000003", "step-0000006"]
    shutil.rmtree(ckpts / "step-0000006")  # as if the process had died after step 3's checkpoint
    shutil.rmtree(tmp_path / "run" / "run" / "final")
    cfg = load_config(lm_config, [f"output_dir={tmp_path / 'run'}", "train.max_steps=6", "train.save_every=3",
                                  "train.keep_last=5", "train.save_at_epoch_end=false",
                                  "train.eval_every=3", "model.dropout=0.1"])
    assert train(cfg, str(lm_config), resume="auto") == signals.EXIT_OK
    resumed = load_file(str(tmp_path / "run" / "run" / "final" / "model.safetensors"))
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)


def test_sampling_at_validation_never_changes_what_is_trained(lm_config, tmp_path):
    """Sampling draws from its own seeded RNG (fork_rng): a run that samples trains the same weights, with
    dropout on, as one that does not."""
    common = ("model.dropout=0.1",)
    quiet = _train(lm_config, tmp_path / "quiet", *common, "lm.sample_tokens=0", max_steps=4, eval_every=2)
    sampled = _train(lm_config, tmp_path / "sampled", *common, max_steps=4, eval_every=2)
    assert (tmp_path / "sampled" / "run" / "samples" / "step-0000002.jsonl").is_file()
    assert not (tmp_path / "quiet" / "run" / "samples").exists()
    assert all(torch.equal(quiet[k], sampled[k]) for k in quiet)


@pytest.mark.slow
def test_two_processes_equal_one_with_the_same_global_batch(lm_config, tmp_path):
    """2 gloo processes at batch 4 against 1 at batch 8 (dropout off): the ranks' blocks hold different numbers
    of targets, so averaging the ranks' means would differ; the step's mean over all targets does not. The ranks
    are forked from the warm zygote with the environment `accelerate launch` gives them (trainkit.fork_launch_ranks;
    the launcher itself: tests/training/test_multiprocess.py)."""
    from tests.training.multikit import log_of
    from tests.training.trainkit import fork_launch_ranks
    from tests.zygote import wait_ranks

    one = _train(lm_config, tmp_path / "one", max_steps=3, batch_size=8)
    two_dir = tmp_path / "two"
    shutil.copytree(Path(load_config(lm_config).output_dir) / "data", two_dir / "data", symlinks=True)
    config = two_dir / "config.yaml"
    tree = yaml.safe_load(lm_config.read_text(encoding="utf-8"))
    tree["output_dir"] = str(two_dir)
    config.write_text(yaml.safe_dump(tree), encoding="utf-8")
    ranks = fork_launch_ranks(config, "train.max_steps=3", "train.batch_size=4")
    assert wait_ranks(ranks, timeout=300) == [0, 0], log_of(config, "multi-0")[-3000:]
    two = load_file(str(two_dir / "run" / "final" / "model.safetensors"))
    assert _max_diff(one, two) < 1e-5


def test_a_time_budget_measures_a_model_with_tied_weights(lm_config, tmp_path):
    """The budget's probe writes the weights once to time a checkpoint: GPT-2's tied lm_head made safetensors
    refuse ("Some tensors share memory"), a traceback before the first step of configs/shakespeare.yaml."""
    from pipeline.training import rundir

    _train(lm_config, tmp_path / "budget", max_minutes=0.5, max_steps=2)
    fixed = rundir.first_budget(tmp_path / "budget" / "run")
    assert fixed["total_steps"] == 2 and fixed["measured_seconds"]["checkpoint"] > 0


def test_the_final_export_is_a_text_generation_pipeline_and_its_card_reports_perplexity(lm_config, tmp_path):
    """final/ answers through transformers.pipeline(), and final/README.md is a language model's card, which
    evaluate (in this process) rewrites with its perplexity (test_card.py's
    test_a_language_models_card_reports_perplexity_and_is_rewritten_by_evaluate, which ran train.py and evaluate.py
    as processes on a run of its own)."""
    from huggingface_hub import ModelCard
    from transformers import pipeline

    from pipeline import artifacts
    from pipeline.evaluation.run import evaluate_checkpoint
    from tests.accelkit import reset

    _train(lm_config, tmp_path / "gen", max_steps=2)
    final = tmp_path / "gen" / "run" / "final"
    generate = pipeline("text-generation", model=str(final), device="cpu")
    text = generate("w1 w2", max_new_tokens=5, do_sample=False)[0]["generated_text"]
    assert text.startswith("w1 w2") and len(text) > len("w1 w2")

    before = ModelCard.load(final / "README.md")
    assert before.data.pipeline_tag == "text-generation" and before.data.eval_results is None
    assert "No evaluate.py figures yet" in before.text
    reset()
    m = evaluate_checkpoint(load_config(lm_config, [f"output_dir={tmp_path / 'gen'}", "eval.split=test"]),
                            str(lm_config), progress=False)["lm"]
    after = ModelCard.load(final / "README.md")
    got = {r.metric_type: r.metric_value for r in after.data.eval_results}
    assert got == {"perplexity": m["perplexity"], "bits_per_byte": m["bits_per_byte"]}
    assert after.data.metrics == ["bits_per_byte", "perplexity"]
    assert 'pipeline("text-generation"' in after.text
    assert artifacts.check_files(final) is None


def test_prepared_blocks_of_another_size_are_refused_and_a_new_prompt_prepares_nothing(lm_config):
    from pipeline.data.prepared import load_prepared

    with pytest.raises(ValueError, match="made with other data settings than this config"):
        load_prepared(c := load_config(lm_config, ["lm.block_size=32"]), tasks.get(c.task))
    cfg = load_config(lm_config, ["lm.prompts=[w7]", "lm.sample_tokens=9"])
    assert load_prepared(cfg, tasks.get(cfg.task)).info["block_size"] == 16
    rows = runner.run(c := load_config(lm_config, ["lm.prompts=[w7]"]), tasks.get(c.task), progress=False)
    assert all(r["cached"] for r in rows)


@pytest.mark.parametrize("source", ["step-0000003", "final"])
def test_a_warm_start_begins_at_step_0_from_the_checkpoints_weights_with_a_fresh_optimizer(lm_config, tmp_path, source):
    from accelerate.state import AcceleratorState, GradientState

    from pipeline.training.setup import prepare_run

    first = _train(lm_config, tmp_path / "first", max_steps=3, save_every=3, save_at_epoch_end=False)
    start = tmp_path / "first" / "run" / ("final" if source == "final" else f"checkpoints/{source}")
    second = tmp_path / "second"
    shutil.copytree(Path(load_config(lm_config).output_dir) / "data", second / "data", symlinks=True)
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    s, st = prepare_run(load_config(lm_config, [f"output_dir={second}", f"train.init_from={start}"]), str(lm_config), None)
    model = s.acc.unwrap_model(s.model)
    weights = model.state_dict()
    assert st.step == 0 and not s.optimizer.state  # a fresh optimizer: no moments
    assert all(torch.equal(weights[k], first[k]) for k in first)
    assert torch.equal(model.lm_head.weight, model.transformer.wte.weight)  # the tie the checkpoint stored once
    s.acc.end_training()


def test_a_warm_start_from_another_models_checkpoint_is_one_line(lm_config, tmp_path):
    _train(lm_config, tmp_path / "wide", "model.hidden_size=48", max_steps=1)
    with pytest.raises(ValueError, match=r"^train.init_from: .*model.safetensors: transformer.h.0.attn.c_attn.bias has "
                                         r"shape \(144,\), this model's \(96,\); start from a checkpoint of the same "
                                         r"model and vocabulary$"):
        _train(lm_config, tmp_path / "narrow", f"train.init_from={tmp_path / 'wide' / 'run' / 'final'}", max_steps=1)


def test_prompts_that_cannot_be_sampled_are_one_line_before_any_file_and_a_failed_launch_never_blocks_a_rerun(
        lm_config, tmp_path, monkeypatch):
    """lm.sample_tokens past the model's positions, lm.prompts=[""] and a prompt longer than the positions were
    80-90-line IndexErrors at step 0's sample, after the run folder was made; a plain rerun was then refused until
    --restart. Now each is refused with the run folder untouched, and a launch that fails after its launch record
    (here a tracker that cannot start) is set aside by the next plain run, which trains."""
    out = tmp_path / "out"
    out.mkdir()
    shutil.copytree(Path(load_config(lm_config).output_dir) / "data", out / "data", symlinks=True)
    positions = 16  # the tiny GPT-2's n_positions: lm.block_size
    cases = [
        (["lm.sample_tokens=20"], r"^lm.prompts\[0\] \(2 tokens\) and lm.sample_tokens=20 need 22 positions, and the "
                                  rf"model has {positions}: set lm.sample_tokens to 14 or less, or shorten the prompt$"),
        (['lm.prompts=["w1", ""]'], r"^lm.prompts\[1\] is '', which encodes to no token: a sample continues its prompt; "
                                    r"give it some text, or set lm.prompts=\[\] to sample nothing$"),
        ([f'lm.prompts=["{" ".join(["w1"] * 20)}"]'], rf"^lm.prompts\[0\] is [2-9]\d tokens, and the model has {positions} "
                                                      r"positions: shorten it$"),
    ]
    for overrides, message in cases:
        reset()
        try:
            with pytest.raises(ValueError, match=message):
                train(load_config(lm_config, [f"output_dir={out}", *overrides]), str(lm_config))
        finally:
            reset()
        assert sorted(p.name for p in out.iterdir()) == ["data"], overrides  # no run folder, nothing to clear

    from pipeline.training import trackers

    def cannot_start(*_):  # as a W&B folder that cannot be created fails: after config.yaml and run_info.json
        raise ValueError("train.report_to: wandb could not start: PermissionError: [Errno 13] Permission denied")

    monkeypatch.setattr(trackers, "open_trackers", cannot_start)
    reset()
    try:
        with pytest.raises(ValueError, match=r"^train.report_to: wandb could not start"):
            train(load_config(lm_config, [f"output_dir={out}", "train.max_steps=1"]), str(lm_config))
    finally:
        reset()
    monkeypatch.undo()
    assert (out / "run" / "run_info.json").is_file() and not (out / "run" / "metrics.jsonl").exists()
    _train(lm_config, out, max_steps=1)  # the plain rerun: trains, the failed launch moved aside, not deleted
    (aside,) = (out / "run" / "set_aside").iterdir()
    assert (aside / "run_info.json").is_file() and (out / "run" / "final" / "model.safetensors").is_file()


def test_blocks_past_the_models_positions_name_lm_block_size(lm_config, tmp_path):
    """The message told a causal LM's user to lower tokenize.max_length, which its blocks do not read."""
    from transformers import GPT2Config, GPT2LMHeadModel

    short = tmp_path / "short-gpt2"
    GPT2LMHeadModel(GPT2Config(vocab_size=400, n_positions=8, n_embd=16, n_layer=1, n_head=2)).save_pretrained(short)
    out = tmp_path / "out"
    out.mkdir()
    shutil.copytree(Path(load_config(lm_config).output_dir) / "data", out / "data", symlinks=True)
    cfg = load_config(lm_config, [f"output_dir={out}", "model.from_scratch=", f"model.name_or_path={short}"])
    reset()
    try:
        with pytest.raises(ValueError, match=rf"^model {short}: lm.block_size=16 \(longest example 16 tokens\) exceeds "
                                             r"the model's 8 positions; lower lm.block_size to 8 or less and rerun "
                                             r"prepare$"):
            train(cfg, str(lm_config))
    finally:
        reset()
    assert sorted(p.name for p in out.iterdir()) == ["data"]


def test_a_language_model_trains_with_label_smoothing_and_its_loss_is_the_smoothed_one(lm_config, tmp_path):
    """train.label_smoothing on causal_lm: the run trains, and its first step's loss is above the plain run's (a
    smoothed target costs more than the one-hot at the same weights: the uniform part's -log p is larger)."""
    plain = _train(lm_config, tmp_path / "plain", max_steps=2)
    smooth = _train(lm_config, tmp_path / "smooth", "train.label_smoothing=0.2", max_steps=2)
    assert plain.keys() == smooth.keys()
    first = [json.loads((tmp_path / k / "run" / "metrics.jsonl").read_text().splitlines()[0])["loss"]
             for k in ("plain", "smooth")]
    assert first[1] > first[0]


@pytest.mark.slow
def test_a_compiled_run_is_the_eager_math_resumes_exactly_and_exports_a_plain_model(lm_config, tmp_path):
    """train.compile=true: without dropout the eager run's weights to float rounding (inductor fuses, the math
    stays); with dropout (torch's masks, drawn by the compiled kernels from the checkpointed RNG) a resume equals
    the run that never stopped; final/ is the plain model (its names, loadable by from_pretrained)."""
    from transformers import AutoModelForCausalLM

    eager = _train(lm_config, tmp_path / "eager", max_steps=4)
    compiled = _train(lm_config, tmp_path / "compiled", max_steps=4, compile="true")
    assert eager.keys() == compiled.keys() and _max_diff(eager, compiled) < 1e-4
    extra = ["model.dropout=0.1", "train.max_steps=6", "train.save_every=3", "train.keep_last=5",
             "train.save_at_epoch_end=false", "train.compile=true"]
    straight = _train(lm_config, tmp_path / "run", *extra)
    shutil.rmtree(tmp_path / "run" / "run" / "checkpoints" / "step-0000006")
    shutil.rmtree(tmp_path / "run" / "run" / "final")
    reset()
    assert train(load_config(lm_config, [f"output_dir={tmp_path / 'run'}", *extra]), str(lm_config), "auto") == 0
    resumed = load_file(str(tmp_path / "run" / "run" / "final" / "model.safetensors"))
    assert all(torch.equal(straight[k], resumed[k]) for k in straight)
    assert AutoModelForCausalLM.from_pretrained(str(tmp_path / "run" / "run" / "final")).config.model_type == "gpt2"
