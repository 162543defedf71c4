"""Early stopping on the default config: the same run with and without train.early_stopping_patience.

    python bench/bench_early_stopping.py [--config configs/default.yaml] [--out outputs/bench-early-stopping]
                                         [--eval-every 50] [--patience 2] [--delta 0.0] [--max-steps N]

Prepares once (both runs read the same prepared data), then trains twice from the same seed with validations
every --eval-every steps, once with early stopping (--patience, --delta) and once without, each in its own run
folder, and evaluates each final model on the test split. Prints the CPU, and per run: the steps trained, where
it stopped and which step's model final/ is, training seconds, test accuracy and macro-F1.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_auto_precision import run_script as _run  # noqa: E402 - same folder

from pipeline.accel import describe_cpu  # noqa: E402
from pipeline.checks import load_config  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--out", default="outputs/bench-early-stopping")
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--patience", type=int, default=2)
    ap.add_argument("--delta", type=float, default=0.0)
    ap.add_argument("--max-steps", type=int, default=0, help="train.max_steps of both runs (0: the config's)")
    a = ap.parse_args()
    out = (REPO / a.out).resolve()
    base = [f"output_dir={out / 'data-owner'}"]
    print(f"cpu: {describe_cpu()}", flush=True)
    prep = _run("pipeline/prepare.py", "--config", a.config, "--quiet", *base)
    print(f"prepare: {prep:.0f} s", flush=True)
    rows = []
    for name, extra in (("early stopping", [f"train.early_stopping_patience={a.patience}",
                                            f"train.early_stopping_delta={a.delta}"]),
                        ("without", [])):
        folder = out / name.replace(" ", "-")
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(out / "data-owner" / "data", folder / "data", symlinks=True)
        over = [f"output_dir={folder}", f"train.eval_every={a.eval_every}", *extra,
                *([f"train.max_steps={a.max_steps}"] if a.max_steps else [])]
        seconds = _run("pipeline/train.py", "--config", a.config, *over)
        _run("pipeline/evaluate.py", "--config", a.config, "--quiet", "--split", "test", *over)
        cfg = load_config(REPO / a.config, over)
        state = json.loads((cfg.run_dir / "final" / "state.json").read_text())
        lines = (cfg.run_dir / "metrics.jsonl").read_text().splitlines()
        trained = max(json.loads(line).get("step", 0) for line in lines)
        test = json.loads((cfg.run_dir / "eval" / "test-final" / "metrics.json").read_text())["document"]
        stop = state.get("early_stopped")
        rows.append((name, trained, f"step {stop['stopped_at']}" if stop else "-", state["step"], seconds,
                     test["accuracy"], test["macro_f1"]))
    print("| run | steps trained | stopped | final/ is step | train s | test accuracy | macro-F1 |")
    print("|---|---|---|---|---|---|---|")
    for name, trained, stop, final, seconds, acc, f1 in rows:
        print(f"| {name} | {trained} | {stop} | {final} | {seconds:.0f} | {acc:.4f} | {f1:.4f} |")


if __name__ == "__main__":
    main()
