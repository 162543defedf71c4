#!/usr/bin/env bash
# GPU check of the checkpoint format (issue 11). Not run yet: no GPU machine was lent to the session
# that wrote it. About 10 minutes on one GPU (estimate: prepare ~2 min, the runs ~5 min side by side).
# Its kill/resume/compare plumbing was dry-run on CPU (configs/tiny.yaml, one variant in fp32, no
# FSDP, no loader part): 120 steps, killed after 70, resumed from step 40, == (113 s).
#
# Needs: one CUDA GPU; torch 2.13 CUDA build installed first, then scripts/setup.sh (accelerate,
# transformers, safetensors, datasets, numpy: the pinned versions of constraints.txt). Nothing else.
#
# For each of fp16, bf16 (one process, python pipeline/train.py) and FSDP2 (accelerate launch with
# configs/accelerate/fsdp.yaml on 1 process, bf16): an uninterrupted run of the default config
# (MiniLM, 120 steps, a checkpoint every 40) and, beside it, a run SIGKILLed after step 70 and resumed
# with --resume auto. The same for task=causal_lm (configs/shakespeare.yaml, the GPT-2 on the plays)
# in fp16 and bf16: lm-fp16, lm-bf16 (and lm-fp16 at lr 1e-2: where its loss turns NaN). Per-step loss/lr/grad-norm and final weights must be equal (==); the table
# gives the largest difference where they are not. Then the loader: batches per second of the
# train split copied to the GPU with pin_memory + non_blocking (what training does on a GPU) and
# with neither. LoRA (peft.method=lora, issue 25): lora-bf16 (the default config's MiniLM with adapters, bf16)
# and, where bitsandbytes is installed, qlora (SmolLM2-135M, configs/smollm2_shakespeare.yaml, its base in 4-bit
# NF4: peft.quantize=nf4, bf16), each killed and resumed the same way, and final/ (the adapter merged into the
# full-precision base) scored by evaluate.py against final/adapter: the same perplexity.
# Results: $OUT/gpu_check.md (also printed). Exit 1 if any run differs.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-outputs/gpu_check}
STEPS=120 SAVE=40 KILL_AFTER=70
COMMON=(train.max_steps=$STEPS train.save_every=$SAVE train.eval_every=60 train.deterministic=true train.log_every=1)
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU visible')"
rm -rf "$OUT" && mkdir -p "$OUT"
start=$(date +%s)

python pipeline/prepare.py --config configs/default.yaml --quiet --num-proc 8 output_dir="$OUT/base" > "$OUT/prepare.log" 2>&1
python pipeline/prepare.py --config configs/shakespeare.yaml --quiet output_dir="$OUT/lmbase" >> "$OUT/prepare.log" 2>&1
VARIANTS="fp16 bf16 fsdp2 lm-fp16 lm-bf16 lora-bf16"
if python -c "import bitsandbytes" 2>/dev/null; then
  python pipeline/prepare.py --config configs/smollm2_shakespeare.yaml --quiet output_dir="$OUT/smolbase" >> "$OUT/prepare.log" 2>&1
  VARIANTS="$VARIANTS qlora"
else
  echo "qlora: skipped (bitsandbytes is not installed: pip install bitsandbytes)" | tee "$OUT/qlora-skipped"
fi

# variant -> launcher prefix and overrides
launcher() {
  case $1 in
    fp16|bf16|lm-fp16|lm-bf16|lora-bf16|qlora) echo "python pipeline/train.py";;
    fsdp2) echo "accelerate launch --config_file configs/accelerate/fsdp.yaml --num_processes 1 pipeline/train.py";;
  esac
}
precision() {
  case $1 in
    *fp16) echo train.mixed_precision=fp16;; lora-bf16) echo train.mixed_precision=bf16 peft.method=lora;;
    qlora) echo train.mixed_precision=bf16 peft.method=lora peft.quantize=nf4;; *bf16) echo train.mixed_precision=bf16;;
    fsdp2) echo;;
  esac
}
config_of() {
  case $1 in lm-*) echo configs/shakespeare.yaml;; qlora) echo configs/smollm2_shakespeare.yaml;; *) echo configs/default.yaml;; esac
}
base_of() { case $1 in lm-*) echo "$OUT/lmbase";; qlora) echo "$OUT/smolbase";; *) echo "$OUT/base";; esac; }

run() {  # run VARIANT NAME [extra args...]: one training run in $OUT/VARIANT-NAME, sharing base's prepared data
  local v=$1 name=$2; shift 2
  local dir="$OUT/$v-$name"
  mkdir -p "$dir" && ln -sfn "$(realpath "$(base_of "$v")/data")" "$dir/data"
  $(launcher "$v") --config "$(config_of "$v")" output_dir="$dir" "${COMMON[@]}" $(precision "$v") "$@" \
    >> "$dir/train.log" 2>&1
}

kill_tree() {  # SIGKILL a process and all its descendants, by pid (torchrun puts workers in sessions of their own)
  local child
  for child in $(ps -o pid= --ppid "$1"); do kill_tree "$child"; done
  kill -KILL "$1" 2>/dev/null || true
}

logged() {  # logged METRICS STEP: has a training record reached STEP?
  python - "$1" "$2" <<'EOF' 2>/dev/null
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip().endswith("}")]
sys.exit(0 if any(r.get("step", 0) >= int(sys.argv[2]) and "loss" in r for r in rows) else 1)
EOF
}

killed_chain() {  # start, SIGKILL the whole process tree once step KILL_AFTER is logged, resume
  local v=$1 dir="$OUT/$1-resumed"
  run "$v" resumed &
  local pid=$!
  until logged "$dir/run/metrics.jsonl" "$KILL_AFTER"; do
    kill -0 "$pid" 2>/dev/null || { echo "$v: the run ended before step $KILL_AFTER (see $dir/train.log)"; return 1; }
    sleep 0.2
  done
  kill_tree "$pid"
  wait "$pid" 2>/dev/null || true
  echo "killed after step $KILL_AFTER" >> "$dir/train.log"
  run "$v" resumed --resume auto
}

for v in $VARIANTS; do
  run "$v" ref &
  killed_chain "$v" &
done
# the chapter's learning-rate experiment where a NaN can come from: fp16's range (on a CPU, in fp32 or bf16, lr 1e-2
# and even 1e-1 only spike and plateau: docs/language-models.md); its exit code: 0, or 65 halted by nan_policy
(rc=0; run lm-fp16 lr1e-2 train.lr=1e-2 || rc=$?; echo $rc > "$OUT/lm-fp16-lr1e-2/exit") &
wait

python - "$OUT" "$start" $VARIANTS <<'EOF' | tee "$OUT/gpu_check.md"
import json, sys, time
from pathlib import Path

import torch
from safetensors.torch import load_file

out, start = Path(sys.argv[1]), float(sys.argv[2])
def rows(d):
    recs = [json.loads(l) for l in (d / "run" / "metrics.jsonl").read_text().splitlines() if l.strip()]
    return [(r["step"], r["loss"], r["lr"], r["grad_norm"]) for r in recs if "loss" in r and "eval" not in r and "event" not in r]
print("| variant | steps | resumed from | losses == | max loss diff | weights == | max weight diff |")
print("|---|---|---|---|---|---|---|")
bad = False
for v in sys.argv[3:]:
    ref, res = out / f"{v}-ref", out / f"{v}-resumed"
    a, b = rows(ref), rows(res)
    wa, wb = load_file(str(ref / "run/final/model.safetensors")), load_file(str(res / "run/final/model.safetensors"))
    dl = max((abs(x[1] - y[1]) for x, y in zip(a, b)), default=float("nan"))
    dw = max((wa[k].float() - wb[k].float()).abs().max().item() for k in wa)
    same = a == b and all(torch.equal(wa[k], wb[k]) for k in wa)
    bad |= not same
    frm = [l for l in (res / "train.log").read_text().splitlines() if "resuming from" in l]
    print(f"| {v} | {len(b)} | {Path(frm[-1].split('resuming from ')[1].split(' at ')[0]).name if frm else 'NOT RESUMED'} | {a == b} | {dl:.3g} | "
          f"{all(torch.equal(wa[k], wb[k]) for k in wa)} | {dw:.3g} |")
print(f"\nruns took {time.time() - start:.0f} s in all (prepare included)")
sys.exit(1 if bad else 0)
EOF
status=${PIPESTATUS[0]}

python - "$OUT/lm-fp16-lr1e-2" <<'EOF' | tee -a "$OUT/gpu_check.md"
# lr 1e-2 in fp16: at which step the loss turned non-finite, and what train.nan_policy (skip, halt after 5) did
import json, math, sys
from pathlib import Path

run = Path(sys.argv[1])
rows = [json.loads(l) for l in (run / "run/metrics.jsonl").read_text().splitlines()]
events = [r for r in rows if r.get("event") == "nonfinite"]
steps = [r for r in rows if "loss" in r and "event" not in r and "eval" not in r]
print(f"\nlm-fp16 at lr 1e-2: exit {(run / 'exit').read_text().strip()}, {len(steps)} steps logged, "
      f"first non-finite loss at step {events[0]['step'] if events else None}, {len(events)} updates skipped; "
      f"largest finite loss {max((r['loss'] for r in steps if math.isfinite(r['loss'])), default=None)}")
EOF

# LoRA's two exports score the same: final/ (merged; QLoRA's into the full-precision base) and final/adapter
for v in lora-bf16 qlora; do
  [ -d "$OUT/$v-ref/run/final/adapter" ] || continue
  for ckpt in final "$OUT/$v-ref/run/final/adapter"; do
    python pipeline/evaluate.py --config "$(config_of "$v")" output_dir="$OUT/$v-ref" --split validation \
      --checkpoint "$ckpt" 2>>"$OUT/$v-ref/eval.log" | tail -1 | sed "s|^|$v $(basename "$ckpt"): |" | tee -a "$OUT/gpu_check.md"
  done
done

# train.mixed_precision=auto (the default) on the GPU: bf16 on capability 8+, recorded with its reason
mkdir -p "$OUT/auto" && ln -sfn "$(realpath "$OUT/base/data")" "$OUT/auto/data"
python pipeline/train.py --config configs/default.yaml output_dir="$OUT/auto" train.max_steps=5 > "$OUT/auto/train.log" 2>&1
python - "$OUT/auto/run/run_info.json" <<'EOF' | tee -a "$OUT/gpu_check.md"
import json, sys

import torch

launch = json.load(open(sys.argv[1]))["launches"][0]
want = "bf16" if torch.cuda.is_bf16_supported(including_emulation=False) else "no"
print(f"auto: trained {launch['mixed_precision']} ({launch['mixed_precision_chosen_by']}), validated "
      f"{launch['eval_precision']}; expected {want}: {'ok' if launch['mixed_precision'] == want else 'WRONG'}")
EOF

python - "$OUT/base" <<'EOF' | tee -a "$OUT/gpu_check.md"
# what pinned memory + non_blocking copies buy: train-split batches (as the loop makes them) to the GPU
import sys, time
from pathlib import Path

import numpy as np
import torch
from datasets import load_from_disk

from pipeline import artifacts
from pipeline.training import batching

info = artifacts.read_json(Path(sys.argv[1]) / "data" / "prepared.json")
ds = load_from_disk(str(Path(info["stage_dir"]) / "data"))["train"]
order = batching.epoch_order(np.asarray(ds["length"][:]), 42, 0, 32, True)
collate = batching.Collator(0, 8, 64)
w = torch.randn(64, 64, device="cuda")
print("\n| loader | batches/s |\n|---|---|")
for pin in (False, True):
    loader = batching.make_loader(ds, batching.RankBatches(order, 0, 32, 0, min(400, len(order))), collate, 2, pin_memory=pin)
    torch.cuda.synchronize(); t = time.perf_counter(); n = 0
    for batch in loader:
        batch = {k: v.to("cuda", non_blocking=pin) for k, v in batch.items()}
        (batch["input_ids"].float() @ w[: batch["input_ids"].shape[1]]).sum()  # some GPU work to overlap with
        n += 1
    torch.cuda.synchronize()
    print(f"| pin_memory={pin}, non_blocking={pin} | {n / (time.perf_counter() - t):.0f} |")
EOF
exit "$status"
