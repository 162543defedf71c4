"""Runs for predict.py's tests, made once per module: real prepared data (prepare's stages, seconds) and a final/ of
an untrained tiny model exported as training exports it, with the config.yaml a run records. An untrained model
scores as well as a trained one for "do predict.py and evaluate.py agree".
"""

from __future__ import annotations

import importlib.util
import os
import random
from pathlib import Path
from unittest import mock

from pipeline import tasks
from pipeline.checks import load_config
from pipeline.config import to_yaml
from pipeline.data import runner

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny.yaml"


def main(script: str, argv: list[str]) -> int:
    """main() of an entry script loaded by path, its environment changes undone after (as test_run._main)."""
    spec = importlib.util.spec_from_file_location(f"{script}_entry", REPO / "pipeline" / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with mock.patch.dict(os.environ):
        return module.main(argv)


def classifier_run(root: Path) -> tuple[Path, list[str]]:
    """test_test_set's source (ids, an official split, near copies) prepared with the tiny config, and final/ of a
    2-layer BERT whose weights are scaled up (probabilities far from uniform, so a 1e-6 agreement means something).
    Returns the run folder and the overrides that make its config."""
    import torch
    from transformers import PreTrainedTokenizerFast

    from pipeline.data.prepared import load_prepared
    from pipeline.training import rundir
    from tests.evaluation.test_test_set import write_source
    from tests.evalworld import _model

    src = root / "source.jsonl"
    write_source(src)
    args = [f"output_dir={root / 'out'}", "source.format=jsonl", f"source.path={src}", "source.package=",
            "source.encoding=utf-8", "source.id_field=id", "source.split_field=split", "source.sample=1.0",
            "split.leakage_threshold=0.5", "split.chunk=words", "split.chunk_size=12", "split.chunk_overlap=2"]
    cfg = load_config(TINY, args)
    runner.run(cfg, tasks.get(cfg.task), progress=False)
    prepared = load_prepared(cfg, tasks.get(cfg.task))
    tok = PreTrainedTokenizerFast.from_pretrained(prepared.tokenizer_dir)
    model = _model(len(tok), prepared.info["label_names"], seed=3)
    with torch.no_grad():  # larger weights: an untrained BERT's first token varies little with its input
        for weight in (p for p in model.bert.parameters() if p.dim() == 2):
            weight.mul_(8.0)
        model.classifier.weight.mul_(10.0)
    state = {"step": 0, "epoch": 0, "fingerprints": {"data": prepared.fingerprint}}  # for the model card
    rundir.export_final(model, tok, cfg.run_dir / "final", state=state)
    model.config.save_pretrained(cfg.run_dir / "model_config")
    (cfg.run_dir / "config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
    return cfg.run_dir, args


def many_rows(path: Path, n: int, seed: int = 0) -> None:
    """n JSONL rows of 3-20 words (the source's vocabulary does not matter: an untrained model predicts anything)."""
    import json

    rng = random.Random(seed)
    words = "good bad fine great awful okay love hate meh nice terrible average happy sad".split()
    with open(path, "w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({"id": f"n{i}", "text": " ".join(rng.choices(words, k=rng.randint(3, 20)))}) + "\n")
