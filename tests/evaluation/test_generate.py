"""predict.py for the language-model tasks: greedy generation equal to transformers' model.generate on final/,
sampling settings checked against the model, a file of prompts with per-document perplexity, and the chat (a
conversation kept across turns; Ctrl-D and Ctrl-C end it with exit 0 and no traceback)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.evaluation.predictkit import REPO, main


def _export(config: Path, seed: int = 0) -> Path:
    """final/ of the config's untrained tiny GPT-2 (its task's build_model), and the config.yaml a run records."""
    import torch

    from pipeline import tasks
    from pipeline.checks import load_config
    from pipeline.config import to_yaml
    from pipeline.data.prepared import load_prepared
    from pipeline.training import build, rundir

    cfg = load_config(config)
    task = tasks.get(cfg.task)
    prepared = load_prepared(cfg, task)
    tok = build.load_tokenizer(prepared.tokenizer_dir, cfg.model.from_scratch)
    torch.manual_seed(seed)
    model = task.build_model(cfg, tok, prepared.info)
    state = {"step": 0, "epoch": 0, "fingerprints": {"data": prepared.fingerprint}}  # for the model card
    rundir.export_final(model, tok, cfg.run_dir / "final", state=state)
    (cfg.run_dir / "config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
    return cfg.run_dir


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    from tests.training.trainkit import build_prepared_lm

    return _export(build_prepared_lm(tmp_path_factory.mktemp("lm"), model={"dropout": 0.0}))


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory):
    from tests.training.trainkit import build_prepared_instruct

    return _export(build_prepared_instruct(tmp_path_factory.mktemp("chat"), model={"dropout": 0.0}, n_convs=40))


def _final(run_dir: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(run_dir / "final").eval(), AutoTokenizer.from_pretrained(run_dir / "final")


def test_greedy_prompts_equal_model_generate(lm_run, tmp_path):
    out = tmp_path / "gen.jsonl"
    prompts = ["w1 w2", "w3"]
    assert main("predict", ["--run", str(lm_run), "--prompt", prompts[0], "--prompt", prompts[1], "--max-new-tokens",
                            "6", "--precision", "fp32", "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    model, tok = _final(lm_run)
    for row, prompt in zip(rows, prompts, strict=True):
        ids = tok(prompt, return_tensors="pt")
        gen = model.generate(**ids, max_new_tokens=6, do_sample=False, pad_token_id=model.config.pad_token_id,
                             eos_token_id=tok.eos_token_id)
        assert row["prompt"] == prompt
        assert row["text"] == tok.decode(gen[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)
        assert row["text"]  # six tokens of an untrained model: some text


def test_sampling_is_seeded_and_checked(lm_run, tmp_path, capsys):
    args = ["--run", str(lm_run), "--prompt", "w1", "--max-new-tokens", "8", "--temperature", "1.5", "--top-k", "50"]
    assert main("predict", [*args, "--seed", "1"]) == 0
    first = capsys.readouterr().out
    assert main("predict", [*args, "--seed", "1"]) == 0
    assert capsys.readouterr().out == first
    with pytest.raises(ValueError, match=r"prompt 1 is \d+ tokens and --max-new-tokens 64 needs \d+ positions; the "
                                         r"model has 16: lower --max-new-tokens"):
        main("predict", ["--run", str(lm_run), "--prompt", "w1 w2", "--max-new-tokens", "64"])
    with pytest.raises(ValueError, match=r"--top-p must be in \(0, 1\]"):
        main("predict", ["--run", str(lm_run), "--prompt", "w1", "--top-p", "0"])


def test_prompts_file_with_perplexity(lm_run, tmp_path):
    src = tmp_path / "docs.jsonl"
    texts = ["w1 w2 w3 w4", "w5 w6", "w7"]
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    out = tmp_path / "docs.out.jsonl"
    assert main("predict", ["--run", str(lm_run), "--input", str(src), "--output", str(out), "--quiet",
                            "--max-new-tokens", "4", "--perplexity", "--precision", "fp32"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [0, 1, 2]
    model, tok = _final(lm_run)
    import torch

    for row, text in zip(rows, texts):
        ids = tok(text, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            assert row["perplexity"] == pytest.approx(math.exp(float(model(input_ids=ids, labels=ids).loss)), rel=1e-5)
        gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False,
                             pad_token_id=model.config.pad_token_id, eos_token_id=tok.eos_token_id)
        assert row["text"] == tok.decode(gen[0, ids.shape[1]:], skip_special_tokens=True)


def test_chat_keeps_the_conversation(chat_run, monkeypatch):
    from pipeline import tasks
    from pipeline.checks import load_config
    from pipeline.data.prepared import load_prepared
    from pipeline.evaluation import generate
    from pipeline.training import build

    model, _ = _final(chat_run)
    cfg = load_config(chat_run / "config.yaml")
    prepared = load_prepared(cfg, tasks.get(cfg.task))
    tok = build.load_tokenizer(prepared.tokenizer_dir, cfg.model.from_scratch)
    lines, said, seen = iter(["q1 w1", "q2 w2"]), [], []
    real = generate.encoder(tok, prepared.info)

    def recording(messages):
        seen.append([m["content"] for m in messages])
        return real(messages)

    def read(_prompt):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None  # Ctrl-D

    monkeypatch.setattr(generate, "encoder", lambda tok, info: recording)
    assert generate.chat(model, tok, prepared.info, generate.Sampling(max_new_tokens=3), read, said.append) == 0
    answers = [s.removeprefix("assistant> ") for s in said if s.startswith("assistant> ")]
    assert len(answers) == 2 and said[-1] == ""  # two answers, then the end of input ends the chat
    assert seen == [["q1 w1"], ["q1 w1", answers[0], "q2 w2"]]  # the second turn is asked with the first


def _chat_process(run_dir: Path, stdout=subprocess.PIPE) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    # SIGINT back to its default in the child: a pytest-xdist worker ignores it, a child would inherit that (and
    # Python installs no KeyboardInterrupt handler for a signal ignored at start), so Ctrl-C would never arrive
    return subprocess.Popen([sys.executable, str(REPO / "pipeline" / "predict.py"), "--run", str(run_dir), "--chat",
                             "--max-new-tokens", "3"], stdin=subprocess.PIPE, stdout=stdout,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


@pytest.mark.slow  # two fresh interpreters (~10 s); the fast member: test_chat_keeps_the_conversation (Ctrl-D ends it)
def test_chat_ends_cleanly_on_ctrl_d_and_ctrl_c(chat_run, tmp_path):
    proc = _chat_process(chat_run)
    out, err = proc.communicate("q1 w1\nq2 w2\n", timeout=120)  # then end of input: Ctrl-D
    assert proc.returncode == 0, err
    assert out.count("assistant> ") == 2 and "Traceback" not in err
    log = tmp_path / "chat.out"
    with open(log, "w") as stdout:
        proc = _chat_process(chat_run, stdout)
        proc.stdin.write("q1 w1\n")
        proc.stdin.flush()
        deadline = time.time() + 120
        while time.time() < deadline and "assistant> " not in log.read_text():  # the first answer; Ctrl-C at the prompt
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        proc.wait(60)
    err = proc.stderr.read()
    assert "assistant> " in log.read_text()
    assert proc.returncode == 0 and "Traceback" not in err and "interrupted" not in err, err


def test_model_card_shows_prompt_and_chat_commands(lm_run, capsys):
    import shlex

    from pipeline.checks import load_config
    from pipeline.training import card

    body = card.render(load_config(lm_run / "config.yaml"), lm_run)
    lines = [s for s in body.splitlines() if s.startswith("python pipeline/predict.py")]
    assert [shlex.split(s)[4] for s in lines] == ["--prompt", "--chat", "--input"]
    argv = shlex.split(lines[0])[2:]
    argv[argv.index("--max-new-tokens") + 1] = "4"  # the tiny model has 16 positions
    assert main("predict", argv) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["prompt"] == "Hello"
