"""Data-parallel scaling on this machine: samples/s of pipeline/train.py with 1 and 2 processes.

    python bench/bench_scaling.py [--rows 4000] [--steps 24] [--batch 32] [--repeats 2] [--model minilm|tiny]

Same prepared data (tweets), same model, same global batch (`--batch`, split over the processes),
max_length 64. Variants, interleaved `--repeats` times so that background load hits them alike:
  1 process x 1 thread              the per-core baseline
  1 process x 2 threads             what one process gets from both cores
  2 processes x 1 thread (gloo)     `accelerate launch --config_file configs/accelerate/cpu_multiprocess.yaml`
Throughput is read from the run's metrics.jsonl (samples and seconds per log window, summed over
ranks), leaving out the first window (warm-up); start-up, evaluation and checkpoints are not timed.
Scaling efficiency = samples/s with N processes / (N x samples/s of 1 process with 1 thread).
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

VARIANTS = [  # (name, processes, threads per process)
    ("1 process x 1 thread", 1, 1),
    ("1 process x 2 threads", 1, 2),
    ("2 processes x 1 thread (gloo)", 2, 1),
]


def base_tree(model: str, rows: int) -> dict:
    tree = yaml.safe_load((REPO / "configs" / ("tiny.yaml" if model == "tiny" else "default.yaml")).read_text())
    tree["source"]["max_rows"] = rows
    tree["tokenize"]["max_length"] = 64
    return tree


def prepare(root: Path, tree: dict) -> Path:
    """Run prepare once; return the data directory every variant points at."""
    from pipeline import tasks
    from pipeline.checks import load_config
    from pipeline.data import runner

    tree = {**tree, "output_dir": str(root / "shared")}
    path = root / "prepare.yaml"
    path.write_text(yaml.safe_dump(tree))
    runner.run(c := load_config(path), tasks.get(c.task), progress=False)
    return root / "shared" / "data"


def variant_config(root: Path, name: str, tree: dict, data: Path, procs: int, args) -> Path:
    """A fresh output_dir whose data/prepared.json points at the shared prepared stage."""
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    (out / "data").mkdir(parents=True)
    shutil.copy(data / "prepared.json", out / "data" / "prepared.json")
    train = {**tree.get("train", {}), "batch_size": args.batch // procs, "max_steps": args.steps, "epochs": 100,
             "log_every": args.log_every, "eval_every": 0, "save_every": 0, "save_at_epoch_end": False,
             "keep_last": 1, "keep_best": 0, "group_by_length": True, "gradient_checkpointing": False}
    config = out / "config.yaml"
    config.write_text(yaml.safe_dump({**tree, "output_dir": str(out), "train": train}))
    return config


def run_variant(config: Path, procs: int, threads: int) -> float:
    """Train; return samples/s over the log windows after the first."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    train = [str(REPO / "pipeline" / "train.py"), "--config", str(config)]
    if procs == 1:
        cmd = [sys.executable, *train]
    else:
        env["ACCELERATE_USE_CPU"] = "true"
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
               str(REPO / "configs" / "accelerate" / "cpu_multiprocess.yaml"), "--num_processes", str(procs), *train]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (config.parent / "run" / "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in rows if "samples_per_s" in r][1:]  # the first window holds the warm-up
    samples = sum(r["samples_per_s"] * r["seconds"] for r in windows)
    return samples / sum(r["seconds"] for r in windows)


def _allreduce_worker(rank: int, world: int, port: int, numel: int, repeats: int, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    grads = torch.ones(numel)  # fp32, one flat buffer: DDP's buckets add up to the same bytes
    dist.all_reduce(grads)  # warm-up: connections, buffers
    times = []
    for _ in range(repeats):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(grads)
        times.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(statistics.median(times))
    dist.destroy_process_group()


def allreduce_seconds(numel: int, world: int = 2, repeats: int = 5) -> float:
    """Median time of one gloo all-reduce of `numel` fp32 values between `world` local processes."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_allreduce_worker, args=(r, world, port, numel, repeats, out)) for r in range(world)]
    for proc in procs:
        proc.start()
    seconds = out.get(timeout=600)
    for proc in procs:
        proc.join(timeout=60)
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=4000, help="tweets to prepare")
    p.add_argument("--steps", type=int, default=24, help="optimizer steps per run")
    p.add_argument("--log-every", type=int, default=4, help="steps per timed window")
    p.add_argument("--batch", type=int, default=32, help="global batch (split over the processes)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--model", choices=("minilm", "tiny"), default="minilm",
                   help="the packaged all-MiniLM-L6-v2 (22.7 M), or configs/tiny.yaml's 2-layer BERT")
    p.add_argument("--allreduce-only", action="store_true", help="only time the gloo all-reduce of the gradients")
    args = p.parse_args()
    if args.allreduce_only:
        print_allreduce()
        return
    root = Path(tempfile.mkdtemp(prefix="bench_scaling_"))
    try:
        tree = base_tree(args.model, args.rows)
        data = prepare(root, tree)
        rates: dict[str, list[float]] = {name: [] for name, _, _ in VARIANTS}
        for rep in range(args.repeats):
            for name, procs, threads in VARIANTS:
                t0 = time.perf_counter()
                config = variant_config(root, f"{procs}p{threads}t", tree, data, procs, args)
                rates[name].append(run_variant(config, procs, threads))
                print(f"# repeat {rep + 1}: {name}: {rates[name][-1]:.1f} samples/s "
                      f"({time.perf_counter() - t0:.0f} s with start-up)", file=sys.stderr, flush=True)
        print_table(rates, args)
        print_allreduce()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def print_table(rates: dict[str, list[float]], args) -> None:
    med = {name: statistics.median(v) for name, v in rates.items()}
    base = med[VARIANTS[0][0]]
    model = "all-MiniLM-L6-v2 (22.7 M)" if args.model == "minilm" else "tiny BERT (configs/tiny.yaml)"
    print(f"\n{model}, global batch {args.batch}, max_length 64, {args.steps} steps, median of {args.repeats}\n")
    print("| variant | samples/s | runs | vs 1 process x 1 thread | scaling efficiency |")
    print("|---|---:|---|---:|---:|")
    for name, procs, threads in VARIANTS:
        runs = ", ".join(f"{x:.1f}" for x in rates[name])
        eff = med[name] / (procs * threads * base)
        print(f"| {name} | {med[name]:.1f} | {runs} | {med[name] / base:.2f}x | {eff:.0%} |")


def print_allreduce(params: int = 22_714_371) -> None:
    """What one step's gradient all-reduce costs here: all-MiniLM-L6-v2's fp32 gradients, 2 gloo processes."""
    sec = allreduce_seconds(params)
    nbytes = params * 4
    busbw = 2 * (2 - 1) / 2 * nbytes / sec  # ring all-reduce: each process sends 2(N-1)/N of the buffer
    print(f"\ngloo all-reduce of {nbytes / 1e6:.1f} MB fp32 gradients ({params:,} parameters) between 2 local "
          f"processes: {sec * 1e3:.0f} ms (bus bandwidth {busbw / 1e9:.2f} GB/s)")


if __name__ == "__main__":
    main()
