"""What attention that stops at document boundaries costs, against plain concatenation (run_clm's way).

Both sides train the same GPT-2 (configs/shakespeare.yaml's, from config) on the same packed blocks of the
plays: `document` passes the positions that restart at each document (transformers builds a
block-diagonal causal mask from them: SDPA with an explicit mask), `none` passes positions 0..B-1 (SDPA's
causal fast path, no mask). Forward + backward + AdamW step, interleaved, median of --repeats timings of
--steps steps each, after one warm-up step. Prints the CPU flags that decide the kernels.

    OMP_NUM_THREADS=2 python bench/bench_lm_packing.py [--steps 10] [--repeats 3] [--batch 16]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    import torch

    from pipeline import tasks
    from pipeline.checks import load_config
    from pipeline.data import runner
    from pipeline.data.prepared import load_prepared
    from pipeline.tasks.causal_lm.collate import Collator
    from pipeline.tasks.causal_lm.pack import pack_ids
    from pipeline.training import build

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--out", default=str(ROOT / "outputs" / "bench_lm_packing"))
    args = ap.parse_args()

    cfg = load_config(ROOT / "configs" / "shakespeare.yaml", [f"output_dir={args.out}"])
    runner.run(cfg, tasks.get(cfg.task), progress=False)
    prep = load_prepared(cfg, tasks.get(cfg.task))
    tok = build.load_tokenizer(prep.tokenizer_dir, cfg.model.from_scratch)
    from pipeline.tasks.causal_lm.model import build_model

    blocks = prep.splits["train"]
    rows = [blocks[i] for i in range(args.batch * args.steps)]
    docs_per_block = sum(sum(1 for p in r["position_ids"][1:] if p == 0) for r in rows) / len(rows)  # inside blocks
    collate = Collator(tok.pad_token_id)
    batches = {"document": [collate(rows[i:i + args.batch]) for i in range(0, len(rows), args.batch)]}
    batches["none"] = []
    for b in batches["document"]:  # the same tokens with running positions: no boundaries
        plain = dict(b)
        plain["position_ids"] = torch.arange(b["input_ids"].shape[1]).expand_as(b["input_ids"]).contiguous()
        plain["labels"] = b["input_ids"].clone()
        batches["none"].append(plain)
    batches["document, a boundary in every block"] = []
    for b in batches["document"]:  # the worst case for the mask: every batch builds one
        half = b["input_ids"].shape[1] // 2
        worst = dict(b)
        worst["position_ids"] = torch.cat([torch.arange(half), torch.arange(b["input_ids"].shape[1] - half)]).expand_as(
            b["input_ids"]).contiguous()
        worst["labels"] = b["input_ids"].masked_fill(worst["position_ids"] == 0, -100)
        batches["document, a boundary in every block"].append(worst)
    assert pack_ids  # the blocks above are pack_ids' output, read from the prepared data

    def run(kind: str) -> float:
        torch.manual_seed(0)
        model = build_model(cfg, tok, prep.info).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        warm = batches[kind][0]
        model(**warm).loss.backward()
        opt.step()
        opt.zero_grad()
        start = time.perf_counter()
        for b in batches[kind]:
            model(**b).loss.backward()
            opt.step()
            opt.zero_grad()
        return (time.perf_counter() - start) / len(batches[kind])

    times: dict[str, list[float]] = {k: [] for k in batches}
    for _ in range(args.repeats):
        for kind in batches:
            times[kind].append(run(kind))
    tokens = args.batch * cfg.lm.block_size
    from pipeline.accel import describe_cpu

    print(f"{describe_cpu()}; torch {torch.__version__}, threads {torch.get_num_threads()}; GPT-2 "
          f"{sum(p.numel() for p in build_model(cfg, tok, prep.info).parameters()) / 1e6:.2f} M parameters, batch "
          f"{args.batch} x {cfg.lm.block_size} tokens, {docs_per_block:.3f} document starts inside a block on average")
    print("\n| lm.boundaries | s / step (median) | tokens/s | vs none |\n|---|---:|---:|---:|")
    base = statistics.median(times["none"])
    for kind in batches:
        t = statistics.median(times[kind])
        print(f"| {kind} | {t:.3f} | {tokens / t:,.0f} | {base / t:.2f}x |")


if __name__ == "__main__":
    main()
