"""The three kinds of classification beyond one label per text (configs/pairs.yaml, configs/multilabel.yaml,
configs/regression.yaml) against simple baselines on the same prepared test split.

Baselines, fit on the prepared train split (the texts after clean, dedup and split, as the model saw them):
  majority / mean       pairs: the train split's most frequent class; multilabel: each label's train share as its
                        score, thresholds tuned on validation as the task tunes the model's (a label is then always
                        or never predicted); regression: the train mean (Pearson and Spearman are 0)
  bag of words          scikit-learn TF-IDF of word 1-2-grams (min_df 2) into a linear model: pairs, logistic
                        regression on [first - second, first * second, cosine] (symmetric pairs: |first - second|,
                        so that the order cannot matter); multilabel, one logistic regression per label, thresholds tuned on validation as the
                        model's are;
                        regression, ridge (alpha 1)
  model                 evaluate.py's metrics.json of the run's final model on the test split

    python pipeline/prepare.py --config configs/regression.yaml && python pipeline/train.py --config configs/regression.yaml
    python pipeline/evaluate.py --config configs/regression.yaml --split test
    python bench/bench_kinds.py --config configs/regression.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline import tasks
from pipeline.checks import load_config  # noqa: E402
from pipeline.data.io import pair  # noqa: E402
from pipeline.data.prepared import load_prepared  # noqa: E402


def _vectorizer():
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True)


def _pair_features(vec, texts, symmetric: bool):
    from scipy.sparse import csr_matrix, hstack

    first, second = pair.decode_all(texts)
    a, b = vec.transform(first), vec.transform(second)
    cosine = np.asarray(a.multiply(b).sum(axis=1))  # rows are l2-normalised
    return hstack([abs(a - b) if symmetric else a - b, a.multiply(b), csr_matrix(cosine)]).tocsr()


def pairs(train, test, cfg, validation) -> list[tuple[str, dict]]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score

    y_train, y_test = np.asarray(train["label"]), np.asarray(test["label"])
    majority = np.full_like(y_test, np.bincount(y_train).argmax())
    vec = _vectorizer().fit([s for t in train["text"] for s in pair.decode(t)])
    symmetric = cfg.source.symmetric_pairs
    clf = LogisticRegression(max_iter=2000, C=4.0).fit(_pair_features(vec, train["text"], symmetric), y_train)
    bow = clf.predict(_pair_features(vec, test["text"], symmetric))
    return [(name, {"accuracy": accuracy_score(y_test, p), "macro_f1": f1_score(y_test, p, average="macro")})
            for name, p in (("majority class", majority), ("bag of words", bow))]


def multilabel(train, test, cfg, validation) -> list[tuple[str, dict]]:
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import accuracy_score, f1_score

    from pipeline.tasks.multilabel.score import tune

    y_train, y_val, y_test = (np.asarray(d["label"]) for d in (train, validation, test))
    share = y_train.mean(axis=0)
    cut = tune(np.tile(share, (len(y_val), 1)), y_val, cfg.label.threshold)
    majority = (np.tile(share, (len(y_test), 1)) >= cut).astype(int)
    vec = _vectorizer().fit(train["text"])
    x_train, x_val, x_test = (vec.transform(d["text"]) for d in (train, validation, test))
    p_val, p_test = np.zeros(y_val.shape), np.zeros(y_test.shape)
    for k in range(y_train.shape[1]):
        if 0 < y_train[:, k].sum() < len(y_train):
            clf = LogisticRegression(max_iter=2000, C=4.0).fit(x_train, y_train[:, k])
            p_val[:, k], p_test[:, k] = clf.predict_proba(x_val)[:, 1], clf.predict_proba(x_test)[:, 1]
    bow = (p_test >= tune(p_val, y_val, cfg.label.threshold)).astype(int)

    def scores(p):
        return {"micro_f1": f1_score(y_test, p, average="micro", zero_division=0),
                "macro_f1": f1_score(y_test, p, average="macro", zero_division=0),
                "subset_accuracy": accuracy_score(y_test, p)}

    return [("label shares", scores(majority)), ("bag of words", scores(bow))]


def regression(train, test, cfg, validation) -> list[tuple[str, dict]]:
    from scipy.stats import pearsonr, spearmanr
    from sklearn.linear_model import Ridge

    y_train, y_test = np.asarray(train["label"], dtype=np.float64), np.asarray(test["label"], dtype=np.float64)
    vec = _vectorizer().fit(train["text"])
    bow = Ridge(alpha=1.0).fit(vec.transform(train["text"]), y_train).predict(vec.transform(test["text"]))

    def scores(p, constant=False):
        return {"pearson": 0.0 if constant else pearsonr(p, y_test)[0],
                "spearman": 0.0 if constant else spearmanr(p, y_test)[0],
                "mse": float(np.mean((p - y_test) ** 2)), "mae": float(np.mean(np.abs(p - y_test)))}

    return [("train mean", scores(np.full_like(y_test, y_train.mean()), constant=True)), ("bag of words", scores(bow))]


BASELINES = {"classification": pairs, "multilabel": multilabel, "regression": regression}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", required=True)
    p.add_argument("overrides", nargs="*", help="section.key=value, as the pipeline's commands take them")
    args = p.parse_args()
    cfg = load_config(args.config, args.overrides)
    prep = load_prepared(cfg, tasks.get(cfg.task), args.config)
    train, validation, test = (prep.splits[s].select_columns(["text", "label"])[:] for s in ("train", "validation", "test"))
    rows = BASELINES[cfg.task](train, test, cfg, validation)
    report = cfg.run_dir / "eval" / "test-final" / "metrics.json"
    if report.is_file():
        model = json.loads(report.read_text())["document"]
        rows.append((f"model ({cfg.model.name_or_path or cfg.model.from_scratch})", model))
    keys = list(rows[0][1])
    print(f"{args.config}: {len(train['label']):,} train, {len(test['label']):,} test rows\n")
    print("| predictor | " + " | ".join(keys) + " |\n|---|" + "---:|" * len(keys))
    for name, m in rows:
        print(f"| {name} | " + " | ".join(f"{m[k]:.4f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
