"""Is `auto` precision safe? The default config trained and evaluated in `auto` against the same run in fp32.

    python bench/bench_auto_precision.py [--config configs/default.yaml] [--out outputs/bench-auto]

Prepares once (both runs read the same prepared data), then trains twice from the same seed, in
`train.mixed_precision=auto` and `=no`, each in its own run folder, and evaluates each final model on the
test split in both fp32 and `auto`. Prints the CPU, what `auto` chose and why (run_info.json, metrics.json),
training seconds, test accuracy and macro-F1 of every (training, inference) pair, and how many test
predictions each pair shares with the fp32-trained model evaluated in fp32 (the reference).

On a CPU without native bf16 `auto` is fp32, and the two trainings are the same run: the bench says so and
the agreement is 100% by construction. It answers something on a CPU with avx512_bf16/amx_bf16 (or a GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.accel import NATIVE_BF16_VAR, describe_cpu  # noqa: E402
from pipeline.checks import load_config  # noqa: E402


def run_script(*argv: str) -> float:
    """Run a repository script (`pipeline/train.py ...`) as a process; its wall seconds."""
    start = time.perf_counter()
    subprocess.run([sys.executable, *argv], cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def _predictions(metrics_dir: Path) -> list:
    rows = (json.loads(line) for line in (metrics_dir / "predictions.jsonl").read_text().splitlines())
    return [(r["id"], r["chunk"], r["prediction"]) for r in rows]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="configs/default.yaml")
    p.add_argument("--out", default="outputs/bench-auto", help="output_dir of both runs (the data is prepared there)")
    a = p.parse_args()
    if os.environ.get(NATIVE_BF16_VAR):
        sys.exit(f"${NATIVE_BF16_VAR} is set: unset it, so that auto reads this CPU's flags")
    common = ["--config", a.config, f"output_dir={a.out}"]
    run_script("pipeline/prepare.py", *common)
    rows, reference = [], None
    for trained in ("no", "auto"):  # fp32 first: it is the reference
        folder = Path(a.out) / f"run-{trained}"
        run = [*common, f"run_folder={folder}"]
        seconds = run_script("pipeline/train.py", *run, f"train.mixed_precision={trained}")
        launch = json.loads((folder / "run_info.json").read_text())["launches"][-1]
        for inferred in ("fp32", "auto"):
            run_script("pipeline/evaluate.py", *run, "--split", "test", "--precision", inferred, "--quiet")
            out = folder / "eval" / "test-final"
            metrics = json.loads((out / "metrics.json").read_text())
            preds = _predictions(out)
            reference = reference or preds
            same = sum(x == y for x, y in zip(preds, reference, strict=True)) / len(reference)
            rows.append((f"{trained} -> {launch['mixed_precision']} ({launch['mixed_precision_chosen_by']})",
                         f"{inferred} -> {metrics['precision']}", seconds, metrics["document"]["accuracy"],
                         metrics["document"]["macro_f1"], same, len(reference)))
    cfg = load_config(Path(a.config))
    print(f"\n{describe_cpu()}; {a.config}, {cfg.train.max_steps or cfg.train.epochs} steps/epochs, "
          f"max_length {cfg.tokenize.max_length}\n")
    print("| training | inference | train s | test accuracy | macro-F1 | same predictions as fp32/fp32 |")
    print("|---|---|---:|---:|---:|---:|")
    for train_p, infer_p, seconds, acc, f1, same, n in rows:
        print(f"| {train_p} | {infer_p} | {seconds:.0f} | {acc:.4f} | {f1:.4f} | {100 * same:.2f}% of {n} |")


if __name__ == "__main__":
    main()
