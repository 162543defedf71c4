"""The label audit (train.label_audit) against cleanlab on the default tweets with 5% of the train labels flipped.

    nice -n 10 python bench/bench_label_audit.py [--config configs/default.yaml] [--out outputs/bench-label-audit]
        [--sample 0.15] [--epochs 3] [--noise 0.05] [--folds 5] [--seed 0]

Prepares the default config once (source.sample of it: the default's 400 steps see 42% of the full train split
once, and an audit needs each example seen several times), then picks --noise of the train documents (seeded) and
gives each another class at random, through label.review_file (so the split is the clean run's). Trains:
  clean   the clean labels;
  noisy   the flipped labels with train.label_audit=true: the audit's flagged set against the flipped ids;
  folds   cleanlab 2.9's find_label_issues on 5-fold out-of-sample probabilities of the same model: each fold's
          documents dropped (label.review_file: drop), a model trained on the rest, the fold predicted
          (evaluate.py --split train on the noisy data): its cost is those trainings;
  fixed   the noisy labels with the audit's flagged documents reviewed: a flipped one gets its true label back
          (an oracle stands for the reviewer), a correct one keeps its label.
and evaluates clean, noisy and fixed on test. Prints markdown tables.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench_auto_precision import run_script as _run  # noqa: E402 - same folder

from pipeline.accel import describe_cpu  # noqa: E402
from pipeline.checks import load_config  # noqa: E402


def _review(path: Path, rows: dict) -> Path:
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "label"])
        w.writerows(sorted(rows.items()))
    return path


def _train_docs(cfg) -> tuple[list[str], list[str], list[str]]:
    """The prepared train split's documents (first row of each id) and their labels; and the class names."""
    from pipeline import tasks
    from pipeline.data.prepared import load_prepared

    prep = load_prepared(cfg, tasks.get(cfg.task))
    ds, names = prep.splits["train"], prep.info["label_names"]
    seen, ids, labels = set(), [], []
    for doc, label in zip(ds["id"][:], ds["label"][:]):
        if doc not in seen:
            seen.add(doc)
            ids.append(doc)
            labels.append(names[label])
    return ids, labels, names


class Bench:
    def __init__(self, a):
        self.a, self.out = a, (REPO / a.out).resolve()
        self.common = [f"source.sample={a.sample}", f"train.epochs={a.epochs}", "train.max_steps=0",
                       "train.eval_every=0", "train.save_every=0", "train.report_to=[]"]

    def folder(self, name: str, review: Path | None, *extra: str) -> tuple[list[str], float]:
        """A run folder with the shared prepared stages copied in, prepared with `review`; (overrides, prepare s)."""
        folder = self.out / name
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(self.out / "data-owner" / "data", folder / "data", symlinks=True)
        over = [f"output_dir={folder}", *self.common, *([f"label.review_file={review}"] if review else []), *extra]
        return over, _run("pipeline/prepare.py", "--config", self.a.config, "--quiet", *over)

    def train(self, over: list[str]) -> float:
        return _run("pipeline/train.py", "--config", self.a.config, *over)

    def test_metrics(self, over: list[str], split: str = "test") -> dict:
        _run("pipeline/evaluate.py", "--config", self.a.config, "--quiet", "--split", split, *over)
        cfg = load_config(REPO / self.a.config, over)
        return json.loads((cfg.run_dir / "eval" / f"{split}-final" / "metrics.json").read_text())["document"]


def _prf(flagged: set, truth: set) -> tuple[int, float, float, float]:
    tp = len(flagged & truth)
    p, r = tp / max(len(flagged), 1), tp / max(len(truth), 1)
    return len(flagged), p, r, (2 * p * r / (p + r) if p + r else 0.0)


def _cleanlab(b: Bench, noise_review: dict, ids: list[str], noisy: dict, names: list[str], noisy_over: list[str]):
    """find_label_issues on out-of-fold probabilities: (flagged ids, training seconds, all seconds)."""
    from cleanlab.filter import find_label_issues

    rng = np.random.default_rng(b.a.seed + 1)
    fold_of = dict(zip(ids, rng.permutation(len(ids)) % b.a.folds))
    probs: dict[str, list[float]] = {}
    trained, start = 0.0, time.perf_counter()
    for f in range(b.a.folds):
        held = {d for d in ids if fold_of[d] == f}
        review = {**noise_review, **{d: "drop" for d in held}}
        over, _ = b.folder(f"fold-{f}", _review(b.out / f"fold-{f}.csv", review))
        trained += b.train(over)
        final = load_config(REPO / b.a.config, over).run_dir / "final"
        # the fold model predicts the noisy train split (the fold's documents are in it): the noisy run's data
        _run("pipeline/evaluate.py", "--config", b.a.config, "--quiet", "--split", "train", "--checkpoint", str(final),
             *noisy_over)
        cfg = load_config(REPO / b.a.config, noisy_over)
        folder = next((cfg.run_dir / "eval").glob("train-*"))
        for line in (folder / "documents.jsonl").read_text().splitlines():
            row = json.loads(line)
            if row["id"] in held:
                probs[row["id"]] = [row["probabilities"][n] for n in names]
        shutil.rmtree(folder)
    order = [d for d in ids if d in probs]
    labels = np.array([names.index(noisy[d]) for d in order])
    issues = find_label_issues(labels, np.array([probs[d] for d in order]))
    return {d for d, bad in zip(order, issues) if bad}, trained, time.perf_counter() - start


def _full_test(b: Bench, trained: set) -> None:
    """The clean, noisy and fixed final models on the whole data's test split (prepared without source.sample), less
    any document in the sample's train split: document accuracy and macro-F1 from each documents.jsonl."""
    from sklearn.metrics import f1_score

    over = [f"output_dir={b.out / 'full-data'}"]
    print(f"prepare (full): {_run('pipeline/prepare.py', '--config', b.a.config, '--quiet', *over):.0f} s", flush=True)
    print("| run | test documents | test accuracy | test macro-F1 |\n|---|---|---|---|")
    for name in ("clean", "noisy", "fixed"):
        final = b.out / name / "run" / "final"
        _run("pipeline/evaluate.py", "--config", b.a.config, "--quiet", "--split", "test", "--checkpoint", str(final),
             *over)
        folder = next((b.out / "full-data" / "run" / "eval").glob("test-*"))
        rows = [json.loads(line) for line in (folder / "documents.jsonl").read_text().splitlines()]
        shutil.rmtree(folder)
        rows = [r for r in rows if r["id"] not in trained]
        y, p = [r["label"] for r in rows], [r["prediction"] for r in rows]
        acc = sum(t == q for t, q in zip(y, p)) / len(rows)
        print(f"| {name} | {len(rows)} | {acc:.4f} | {f1_score(y, p, average='macro'):.4f} |", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--out", default="outputs/bench-label-audit")
    ap.add_argument("--sample", type=float, default=0.15)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-cleanlab", action="store_true")
    ap.add_argument("--full-test", action="store_true", help="score an earlier run's clean, noisy and fixed models on "
                    "the full config's test split, less the documents the sample trained on (a test set 30x larger)")
    ap.add_argument("--only-cleanlab", action="store_true", help="the cleanlab folds alone, beside an earlier run's "
                    "noisy/ folder (same --out, --sample, --epochs, --noise, --seed)")
    a = ap.parse_args()
    b = Bench(a)
    print(f"cpu: {describe_cpu()}", flush=True)
    owner = [f"output_dir={b.out / 'data-owner'}", *b.common]
    print(f"prepare: {_run('pipeline/prepare.py', '--config', a.config, '--quiet', *owner):.0f} s", flush=True)
    ids, labels, names = _train_docs(load_config(REPO / a.config, owner))
    rng = random.Random(a.seed)
    flipped = sorted(rng.sample(ids, round(a.noise * len(ids))))
    given = dict(zip(ids, labels))
    noise = {d: rng.choice([n for n in names if n != given[d]]) for d in flipped}
    noisy = {**given, **noise}
    print(f"train documents {len(ids)}, flipped {len(flipped)}", flush=True)
    if a.full_test:
        _full_test(b, set(ids))
        return
    if a.only_cleanlab:
        noisy_over = [f"output_dir={b.out / 'noisy'}", *b.common, f"label.review_file={b.out / 'noise.csv'}",
                      "train.label_audit=true"]
        found, trained, total = _cleanlab(b, noise, ids, noisy, names, noisy_over)
        n, p, r, f1 = _prf(found, set(flipped))
        print(f"| cleanlab 2.9 find_label_issues, {a.folds}-fold out-of-sample | {n} | {p:.3f} | {r:.3f} | {f1:.3f} | "
              f"{trained:.0f} |\ncleanlab: {trained:.0f} s of training, {total:.0f} s in all", flush=True)
        return

    runs = {}
    over, _ = b.folder("clean", None)
    runs["clean"] = (b.train(over), b.test_metrics(over))
    print(f"clean: {runs['clean']}", flush=True)
    noisy_over, _ = b.folder("noisy", _review(b.out / "noise.csv", noise), "train.label_audit=true")
    runs["noisy"] = (b.train(noisy_over), b.test_metrics(noisy_over))
    print(f"noisy: {runs['noisy']}", flush=True)
    report = load_config(REPO / a.config, noisy_over).run_dir / "label_audit.jsonl"
    rows = [json.loads(line) for line in report.read_text().splitlines()]
    truth = set(flipped)
    audit = {r["id"] for r in rows if r["flagged"]}
    below0 = {r["id"] for r in rows if r["aum"] < 0}
    topk = {r["id"] for r in rows[:len(truth)]}
    for name, found in (("audit", audit), ("AUM < 0", below0), ("AUM top-k", topk)):
        print(f"{name}: flagged, precision, recall, F1 = {_prf(found, truth)}", flush=True)
    # the reviewer (an oracle here) gives every flagged flipped document its true label back
    fixed_review = {d: lab for d, lab in noise.items() if d not in audit}
    over, _ = b.folder("fixed", _review(b.out / "fixed.csv", fixed_review))
    runs["fixed"] = (b.train(over), b.test_metrics(over))
    print(f"fixed: {runs['fixed']}", flush=True)
    methods = [("audit (AUM ranked, confident-joint count): the one noisy run", audit, runs["noisy"][0]),
               ("AUM < 0 (the same run, another cut)", below0, runs["noisy"][0]),
               ("AUM top-k, k = the true count (an oracle's k, for reference)", topk, runs["noisy"][0])]
    if not a.skip_cleanlab:
        found, trained, total = _cleanlab(b, noise, ids, noisy, names, noisy_over)
        methods.append((f"cleanlab 2.9 find_label_issues, {a.folds}-fold out-of-sample", found, trained))
        print(f"cleanlab: {trained:.0f} s of training, {total:.0f} s in all; {_prf(found, truth)}", flush=True)
    print(f"\ntrain documents {len(ids)}, flipped {len(truth)} ({a.noise:.0%}), audited {len(rows)}\n")
    print("| method | flagged | precision | recall | F1 | training s |")
    print("|---|---|---|---|---|---|")
    for name, found, seconds in methods:
        n, p, r, f1 = _prf(found, truth)
        print(f"| {name} | {n} | {p:.3f} | {r:.3f} | {f1:.3f} | {seconds:.0f} |")
    print("\n| run | train s | test accuracy | test macro-F1 |")
    print("|---|---|---|---|")
    for name, (seconds, m) in runs.items():
        print(f"| {name} | {seconds:.0f} | {m['accuracy']:.4f} | {m['macro_f1']:.4f} |")
    per = {n: sum(1 for r in rows if r["flagged"] and r["label"] == n) for n in names}
    print(f"\nflagged per given class: {per}; fixed review: {len(noise) - len(fixed_review)} flipped labels restored")


if __name__ == "__main__":
    main()
