"""train.label_audit (pipeline/training/audit.py): the margin each train row gets, the rows a micro-batch holds, the
report per document, the confident-joint count that sets how many are flagged, the record through a checkpoint, and a
real run on toy data with 5% of its train labels flipped. The resume and 2-process properties are checked where those
runs already are: test_loop.py's in-process stop and resume, test_resume_kill.py's kill matrix, test_multiprocess.py's
2 == 1 process scenario."""

from __future__ import annotations

import json
import random
import types

import numpy as np
import pytest
import torch

from pipeline import tasks
from pipeline.training import audit, batching


def test_the_margin_is_the_given_labels_logit_minus_the_largest_other():
    logits = torch.tensor([[2.0, 0.5, -1.0], [0.0, 3.0, 1.0], [1.0, 1.0, 4.0]])
    got = tasks.get("classification").margins(logits, torch.tensor([0, 0, 2]))
    assert got.tolist() == [1.5, -3.0, 3.0]
    assert tasks.get("multilabel").margins is None and tasks.get("regression").margins is None


def _audit(rows=40, world=1, rank=0, batch=4, group=True):
    lengths = np.random.default_rng(0).integers(2, 30, size=rows)
    return audit.LabelAudit(rows, 3, tasks.get("classification").margins, lengths, 7, batch, world, rank, group)


def test_each_micro_batch_is_recorded_on_the_rows_the_loader_gave_it():
    """The rows audit.see adds to are RankBatches' rows of that (epoch, micro-batch) on that rank: over two epochs of
    two ranks, every row seen twice, margins summed where the loader put them."""
    recs = [_audit(world=2, rank=r) for r in (0, 1)]
    for epoch in (0, 1):
        order = batching.epoch_order(recs[0].lengths, 7, epoch, 8, True)
        for r, rec in enumerate(recs):
            for b, rows in enumerate(batching.RankBatches(order, r, 4, 0, len(order))):
                logits = torch.zeros(4, 3)
                logits[:, 0] = torch.tensor(rows, dtype=torch.float32)  # the row's own number as its margin
                rec.see(logits, torch.zeros(4, dtype=torch.long), epoch, b)
    seen, margin = recs[0].seen + recs[1].seen, recs[0].margin + recs[1].margin
    assert (seen == 2).all() and np.array_equal(margin, 2 * np.arange(40, dtype=np.float64))


def test_a_non_finite_margin_is_not_counted():
    rec = _audit(group=False)
    logits = torch.tensor([[1.0, 0.0, 0.0], [float("nan"), 0.0, 0.0], [0.0, 2.0, 0.0], [0.0, 0.0, 0.0]])
    rec.see(logits, torch.tensor([0, 0, 0, 0]), 0, 0)
    rows = batching.epoch_order(rec.lengths, 7, 0, 4, False)[0]
    assert rec.seen[rows].tolist() == [1, 0, 1, 1] and rec.margin[rows].tolist() == [1.0, 0.0, -2.0, 0.0]


def test_the_confident_joint_counts_the_issues_of_each_class():
    """Thresholds: class 0's mean p0 over its documents, class 1's p1 over its; a document counts for the other class
    of highest probability among those at or above their threshold."""
    p = np.array([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7],   # labeled 0: t0 = 0.667; the third has p1 0.7 >= t1
                  [0.1, 0.9], [0.6, 0.4], [0.2, 0.8]])  # labeled 1: t1 = 0.7; the fifth has p0 0.6 < t0: not counted
    labels = np.array([0, 0, 0, 1, 1, 1])
    assert audit.issues_per_class(labels, np.log(p)).tolist() == [1, 0]
    order = np.array([4, 2, 1, 0, 3, 5])  # lowest AUM first
    assert audit.flag(order, labels, np.log(p)).tolist() == [False, False, True, False, False, False]


def test_the_report_is_per_document_ranked_by_aum_with_unseen_rows_left_out():
    """A chunked document's AUM is the mean of its rows' AUMs (d1: rows of AUM -1 and -3: -2); a row never seen is in
    no document; the lowest AUM first."""
    ds = {"id": ["d0", "d1", "d1", "d2", "d3"], "label": [0, 1, 1, 0, 1], "text": ["a", "b", "b2", "c", "d"]}
    ds = _Columns(ds)
    totals = {"margin": np.array([2.0, -2.0, -9.0, 4.0, 0.0]), "seen": np.array([2, 2, 3, 1, 0]),
              "logits": np.array([[2.0, 0.0], [2.0, 0.0], [9.0, 0.0], [4.0, 0.0], [0.0, 0.0]])}
    rows = audit.documents(totals, ds, ["neg", "pos"], 160)
    assert [(r["id"], r["aum"], r["seen"], r["rows"], r["most_likely"], r["text"]) for r in rows] == [
        ("d1", -2.0, 5, 2, "neg", "b"), ("d0", 1.0, 2, 1, "neg", "a"), ("d2", 4.0, 1, 1, "neg", "c")]
    info = audit.summary(rows, ["neg", "pos"], 1)
    assert info["documents"] == 3 and info["unseen_rows"] == 1 and set(info["per_class"]) == {"neg", "pos"}


class _Columns:
    def __init__(self, cols):
        self.cols, self.column_names = cols, list(cols)

    def __getitem__(self, name):
        return self.cols[name]


def test_the_record_goes_through_a_checkpoint_to_rank_0_and_a_mismatch_is_one_line(tmp_path):
    rec = _audit()
    rec.see(torch.randn(4, 3), torch.tensor([0, 1, 2, 0]), 0, 0)
    acc = types.SimpleNamespace(num_processes=1, device=torch.device("cpu"))
    audit.save(rec.totals(acc), tmp_path)
    first, other = _audit(), _audit(world=2, rank=1)
    first.load(tmp_path)
    other.load(tmp_path)
    assert np.array_equal(first.margin, rec.margin) and np.array_equal(first.logits, rec.logits)
    assert not other.seen.any()  # the other ranks start at zero: the sum over ranks is the saved record
    with pytest.raises(ValueError, match=r"records 40 train rows, the prepared train split has 41"):
        audit.LabelAudit(41, 3, None, np.ones(41, dtype=np.int64), 7, 4, 1, 0, True).load(tmp_path)
    with pytest.raises(ValueError, match=r"has no label_audit.npz: it was saved without train.label_audit"):
        _audit().load(tmp_path / "elsewhere")


@pytest.mark.slow
def test_a_run_with_5_percent_flipped_labels_flags_them_and_says_so_in_the_card(tmp_path, fresh_accelerate, monkeypatch):
    """400 toy rows, 20 (5%) given another class at random (seeded): the flagged set's precision and recall against
    them (measured 1.0 and 0.8; chance is 0.05), the top 20 of the ranking, the report's fields, metrics.jsonl's
    event and the card's section."""
    import tests.training.trainkit as tk
    from pipeline.checks import load_config
    from pipeline.training.loop import train

    real, flipped = tk.toy_rows, set()

    def noisy(n, seed):
        rows = real(n, seed)
        if seed == 1:  # train
            rng = random.Random(7)
            for r in rng.sample(rows, n // 20):
                r["label"] = (r["label"] + rng.randrange(1, 3)) % 3
                flipped.add(r["id"])
        return rows

    monkeypatch.setattr(tk, "toy_rows", noisy)
    config = tk.build_prepared(tmp_path, n_train=400, train={"epochs": 4, "batch_size": 16, "label_audit": True,
                                                             "save_every": 0, "log_every": 10})
    assert train(load_config(config), str(config)) == 0
    run = tk.run_dir(config)
    rows = [json.loads(line) for line in (run / audit.REPORT).read_text().splitlines()]
    assert len(rows) == 400 and len(flipped) == 20 and [r["rank"] for r in rows] == list(range(1, 401))
    flagged = {r["id"] for r in rows if r["flagged"]}
    hits = len(flagged & flipped)
    assert hits / len(flagged) >= 0.7 and hits / len(flipped) >= 0.6, (len(flagged), hits)
    assert len({r["id"] for r in rows[:20]} & flipped) >= 15
    assert all(r["most_likely"] != r["label"] for r in rows[:10])
    event = next(r for r in tk.records(run, "all") if r.get("event") == "label_audit")
    assert event["flagged"] == len(flagged) and sum(c["flagged"] for c in event["per_class"].values()) == len(flagged)
    card = (run / "final" / "README.md").read_text()
    assert "## Label audit" in card and f"{len(flagged)} of 400 train documents flagged" in card


def test_the_audit_does_not_change_the_training(prepared, fresh_accelerate, tmp_path):
    """train.label_audit on and off: the same losses, learning rates, gradient norms, validations and final weights
    (it reads the logits the loss computes; nothing else)."""
    from pipeline.checks import load_config
    from pipeline.training.loop import train
    from tests.accelkit import reset
    from tests.training.trainkit import clone_prepared, final_weights, run_dir, trajectory

    config = prepared(train={"epochs": 1, "eval_every": 5, "save_every": 5})
    other = clone_prepared(config, tmp_path / "audited")
    assert train(load_config(config), str(config)) == 0
    reset()
    assert train(load_config(other, ["train.label_audit=true"]), str(other)) == 0
    assert trajectory(run_dir(config)) == trajectory(run_dir(other))
    a, b = final_weights(run_dir(config)), final_weights(run_dir(other))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (run_dir(other) / audit.REPORT).is_file() and not (run_dir(config) / audit.REPORT).exists()
    assert all((p / audit.AUDIT_FILE).is_file() for p in (run_dir(other) / "checkpoints").iterdir())
