"""train.label_audit: the area under the margin (AUM; Pleiss, Zhang, Elenberg, Weinberger, "Identifying Mislabeled
Data using the Area Under the Margin Ranking", NeurIPS 2020) of every train example, from the run's own training.

Each time a train row goes through the model in training, its margin (the task's Task.margins: its given label's
logit minus the largest other) is added to that row's sum and its logits to its logit sums; AUM is the mean margin
over the times it was seen. A mislabeled example is learned late, against the rest of its class, so its margin stays
low or negative for most of the run; a hard but correct one climbs earlier. How many are flagged needs no tuning:
of each given class, as many as confident learning's count of issues on the run's mean logits, lowest AUM first
(issues_per_class, flag; docs/label-audit.md says why not AUM's fake-class threshold: it would change the user's
model). The training itself is not changed: the logits are the loss's own.

The record is per row of this process's batches (which rows a micro-batch holds is a pure function of the seed, the
epoch and the micro-batch index, batching.epoch_order); the processes' records are summed (one all-reduce) when a
checkpoint is saved, into AUDIT_FILE in the checkpoint folder, and at the end. A resume loads the file into rank 0's
record (the other ranks start at zero), so the sums a resumed run ends with are those of a run never stopped.
Chunked documents (several rows per id) are scored per document: the mean of their rows' AUMs.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import numpy as np

from pipeline import artifacts
from pipeline.training import batching

AUDIT_FILE = "label_audit.npz"  # in a checkpoint folder: the summed record (margin, seen, logits) of every process
REPORT = "label_audit.jsonl"  # in the run folder: the train documents, most suspicious first
METHOD = "aum-ranked, confident-joint count"  # the report's method (metrics.jsonl's event, the card)


def for_run(t, task, train_ds, info: dict, acc) -> "LabelAudit | None":
    """train.label_audit: an empty record of every train row (its rows' batches are this process's), or None."""
    if not t.label_audit:
        return None
    return LabelAudit(len(train_ds), len(info.get("label_names") or ()), task.margins,
                      np.asarray(train_ds["length"][:], dtype=np.int64), t.seed, t.batch_size, acc.num_processes,
                      acc.process_index, t.group_by_length)


class LabelAudit:
    """This process's record: per train row, its margins' sum, the times it was seen, and its logits' sum."""

    def __init__(self, rows: int, classes: int, margins, lengths: np.ndarray, seed: int, batch_size: int, world: int,
                 rank: int, group_by_length: bool):
        self.margin = np.zeros(rows, dtype=np.float64)
        self.seen = np.zeros(rows, dtype=np.int64)
        self.logits = np.zeros((rows, classes), dtype=np.float64)
        self.margins, self.lengths, self.seed, self.group = margins, lengths, seed, group_by_length
        self.batch_size, self.world, self.rank = batch_size, world, rank
        self._epoch: tuple[int, np.ndarray] | None = None  # (epoch, its order), rebuilt once per epoch

    def _rows(self, epoch: int, micro_batch: int) -> np.ndarray:
        """The train rows of this rank's micro-batch `micro_batch` of `epoch`: what batching.RankBatches gave it."""
        if self._epoch is None or self._epoch[0] != epoch:
            order = batching.epoch_order(self.lengths, self.seed, epoch, self.batch_size * self.world, self.group)
            self._epoch = (epoch, order)
        lo = self.rank * self.batch_size
        return self._epoch[1][micro_batch, lo:lo + self.batch_size]

    def see(self, logits, labels, epoch: int, micro_batch: int) -> None:
        """Record a micro-batch's logits (rows, classes); a row with a non-finite margin is not counted."""
        rows = self._rows(epoch, micro_batch)
        z = logits.detach().float().cpu().double().numpy()
        m = self.margins(logits, labels).cpu().double().numpy()
        ok = np.isfinite(m) & np.isfinite(z).all(axis=1)
        rows, m, z = rows[ok], m[ok], z[ok]
        self.margin[rows] += m  # a micro-batch's rows are distinct: plain fancy-index adds are exact
        self.seen[rows] += 1
        self.logits[rows] += z

    def totals(self, acc) -> dict[str, np.ndarray]:
        """Every process's record summed (a collective: every rank calls it)."""
        import torch

        # (rows, 2 + classes) float64: counts below 2^53 stay exact
        packed = np.concatenate([self.margin[:, None], self.seen[:, None].astype(np.float64), self.logits], axis=1)
        if acc.num_processes > 1:
            packed = acc.reduce(torch.from_numpy(packed).to(acc.device), reduction="sum").cpu().numpy()
        return {"margin": packed[:, 0], "seen": packed[:, 1].round().astype(np.int64), "logits": packed[:, 2:]}

    def load(self, folder: Path) -> None:
        """A resume: rank 0 takes the checkpoint's summed record, the others start at zero."""
        path = folder / AUDIT_FILE
        if not path.is_file():
            raise ValueError(f"{folder} has no {AUDIT_FILE}: it was saved without train.label_audit, so the audit "
                             f"would miss the steps before it; resume with train.label_audit=false, or --restart")
        with np.load(path, allow_pickle=False) as saved:  # arrays only: no pickle can run code
            margin, seen, logits = saved["margin"], saved["seen"], saved["logits"]
        if margin.shape != self.margin.shape or logits.shape != self.logits.shape:
            raise ValueError(f"{path} records {len(margin)} train rows, the prepared train split has "
                             f"{len(self.margin)}; resume on the data it was saved with")
        if self.rank == 0:
            self.margin, self.seen = margin.astype(np.float64), seen.astype(np.int64)
            self.logits = logits.astype(np.float64)


def save(totals: dict, folder: Path) -> None:
    """The summed record into a checkpoint folder being written (its manifest, written after, covers it)."""
    with open(folder / AUDIT_FILE, "wb") as f:
        np.savez(f, **totals)


def checkpoint_writer(s):
    """What a checkpoint save writes of the audit: a function of its folder, with every process's record summed
    now (a collective: every rank calls it); None without train.label_audit."""
    if s.audit is None:
        return None
    return functools.partial(save, s.audit.totals(s.acc))


def at_end(s, st) -> None:
    """The end of training (every rank calls it): the summed record, reported by the main process."""
    if s.audit is None:
        return
    totals = s.audit.totals(s.acc)
    if s.acc.is_main_process:
        finish(s, st, totals)


def documents(totals: dict, ds, names: list[str], chars: int) -> list[dict]:
    """The report's rows: one per train document seen in training, most suspicious (lowest AUM) first; a chunked
    document's AUM is the mean of its rows' AUMs, its most likely class the argmax of its rows' mean logits."""
    seen = totals["seen"]
    kept = np.flatnonzero(seen > 0)
    ids = np.asarray(ds["id"][:], dtype=object)[kept]
    aum = totals["margin"][kept] / seen[kept]
    mean_logits = totals["logits"][kept] / seen[kept, None]
    docs, first, of_row = np.unique(ids, return_index=True, return_inverse=True)
    counts = np.bincount(of_row, minlength=len(docs))
    doc_aum = np.bincount(of_row, weights=aum, minlength=len(docs)) / counts
    doc_logits = np.zeros((len(docs), mean_logits.shape[1]))
    np.add.at(doc_logits, of_row, mean_logits)
    predicted = doc_logits.argmax(axis=1) if doc_logits.shape[1] else np.zeros(len(docs), dtype=np.int64)
    labels = np.asarray(ds["label"][:], dtype=np.int64)[kept][first]
    texts = ds["text"][:] if "text" in ds.column_names else [""] * len(seen)
    times = np.bincount(of_row, weights=seen[kept], minlength=len(docs))
    order = np.lexsort((docs.astype(str), doc_aum))  # lowest AUM first; ties by id: the same file every time
    flagged = flag(order, labels, doc_logits / counts[:, None])
    return [{"rank": r + 1, "id": str(docs[d]), "label": _name(names, labels[d]),
             "most_likely": _name(names, predicted[d]), "aum": round(float(doc_aum[d]), 6),
             "flagged": bool(flagged[d]), "seen": int(times[d]), "rows": int(counts[d]),
             "text": str(texts[kept[first[d]]])[:chars]} for r, d in enumerate(order)]


def issues_per_class(labels: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """(classes,) how many documents of each given class are mislabeled, by confident learning's confident joint
    (Northcutt, Jiang, Chuang, "Confident Learning: Estimating Uncertainty in Dataset Labels", JAIR 2021) on the
    run's softmax of mean logits: class j's threshold t_j is the mean probability of j over the documents labeled
    j; a document labeled i counts for the class j != i of highest probability among those at or above their
    threshold. Scale-free: no setting, whatever the model's confidence."""
    k = logits.shape[1]
    if not len(labels) or not k:
        return np.zeros(k, dtype=np.int64)
    z = logits - logits.max(axis=1, keepdims=True)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)  # (documents, classes)
    t = np.array([p[labels == j, j].mean() if (labels == j).any() else np.inf for j in range(k)])
    above = np.where(p >= t, p, -np.inf)
    j = above.argmax(axis=1)
    off = np.isfinite(above.max(axis=1)) & (j != labels)
    return np.bincount(labels[off], minlength=k)


def flag(order: np.ndarray, labels: np.ndarray, logits: np.ndarray) -> np.ndarray:
    """(documents,) bool: of each given class i, the n_i lowest-AUM documents (`order`: lowest AUM first), n_i its
    confident-joint count of issues (issues_per_class): AUM ranks, confident learning counts (cleanlab's
    prune_by_class with AUM as the ranking)."""
    want, out = issues_per_class(labels, logits), np.zeros(len(labels), dtype=bool)
    taken = np.zeros_like(want)
    for d in order:
        c = labels[d]
        if taken[c] < want[c]:
            out[d], taken[c] = True, taken[c] + 1
    return out


def _name(names: list[str], k: int) -> str:
    return names[k] if 0 <= k < len(names) else str(k)


def summary(rows: list[dict], names: list[str], unseen: int) -> dict:
    """How many documents were flagged, in all and per given class."""
    per_class = {n: {"documents": 0, "flagged": 0} for n in names}
    for r in rows:
        c = per_class.setdefault(r["label"], {"documents": 0, "flagged": 0})
        c["documents"] += 1
        c["flagged"] += r["flagged"]
    flagged = sum(r["flagged"] for r in rows)
    return {"method": METHOD, "documents": len(rows), "flagged": flagged,
            "unseen_rows": unseen, "per_class": per_class}


def finish(s, st, totals: dict) -> dict:
    """The end of training, on the main process: run/label_audit.jsonl, the summary in metrics.jsonl, the console
    and the trackers; returns the summary."""
    names = list((s.data_info or {}).get("label_names") or [])
    rows = documents(totals, s.train_ds, names, s.cfg.eval.snippet_chars)  # the text as evaluate.py's reports cut it
    info = summary(rows, names, int((totals["seen"] == 0).sum()))
    artifacts.write_jsonl_atomic(s.run_dir / REPORT, rows)
    s.log.write({"step": st.step, "event": "label_audit", **info})
    scalars = {"label_audit/flagged": info["flagged"],
               "label_audit/flagged_fraction": info["flagged"] / max(info["documents"], 1),
               **{f"label_audit/flagged_{n}": c["flagged"] for n, c in info["per_class"].items()}}
    s.acc.log(scalars, step=st.step)
    per = ", ".join(f"{n} {c['flagged']}" for n, c in info["per_class"].items())
    print(f"label audit: {info['flagged']:,} of {info['documents']:,} train documents flagged as likely mislabeled "
          f"(per class, confident learning's count of the lowest area-under-the-margin ones: {per}); ranked in "
          f"{s.run_dir / REPORT}", flush=True)
    if info["unseen_rows"]:
        print(f"label audit: {info['unseen_rows']:,} train rows were never seen in training (each epoch leaves out the "
              f"rows that do not fill a last global batch; train.max_steps may end before an epoch does) and are not "
              f"in the report", file=sys.stderr, flush=True)
    return info


def read_summary(run_dir: Path) -> dict | None:
    """The audit's counts from a run folder's report (the model card's section); None without one."""
    path = run_dir / REPORT
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return summary(rows, sorted({r["label"] for r in rows}), 0)  # the classes by name: the report has no id order
