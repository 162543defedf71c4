"""predict.py on new rows: (a) throughput against `transformers.pipeline("text-classification")` on the same rows,
and (b) a large input (default 1 GiB) predicted with bounded memory, killed with SIGKILL half way and resumed.

The run is the default classifier's (configs/default.yaml: the packaged all-MiniLM-L6-v2, its WordPiece, max_length
64, the default clean settings), prepared and trained by prepare.py and train.py on a 5% sample of the tweets (48
steps: a real finished run in a minute or two; its accuracy is not the point).

(a) `--rows` tweets (JSONL with ids), interleaved `--repeats` times: pipeline(batch_size=64, truncation at 64), in
fp32 and with its fastest CPU option here, the weights in bf16 (dtype=torch.bfloat16), on the texts predict.py's
clean made (equal rows, equal work; predict.py's time also holds reading, cleaning and writing),
against predictions.predict_file (what `python pipeline/predict.py --input` runs after loading) in each precision
and runtime. Both after loading; examples/s is the median.
(b) a JSONL of long documents (tweets joined, `--doc-kb` each; truncated to 64 tokens, as the model reads them) to
`--big-mb`, in a temporary folder deleted after: predict.py as a real process, SIGKILL when half of its parts are
written, then the same command again; peak RSS of each process (/usr/bin/time's %M), and every id checked to
be written exactly once, in order. Also a 64 MiB input of the same kind, for the RSS against the input's size.

    OMP_NUM_THREADS=2 nice -n 10 python bench/bench_predict.py [--rows 2000] [--repeats 3] [--big-mb 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import numpy as np  # noqa: E402

LABELS = ["negative", "neutral", "positive"]


def make_run(root: Path) -> Path:
    """The default config's run (module docstring) under root, trained by train.py; returns its run folder."""
    from pipeline.checks import load_config

    overrides = [f"output_dir={root}", "source.sample=0.05", "train.max_steps=48", "train.eval_every=0",
                 "train.save_every=0"]
    for script in ("prepare", "train"):
        subprocess.run([sys.executable, str(REPO / "pipeline" / f"{script}.py"), "--config",
                        str(REPO / "configs" / "default.yaml"), *overrides], cwd=REPO, check=True,
                       stdout=subprocess.DEVNULL)
    return load_config(REPO / "configs" / "default.yaml", overrides).run_dir


def _loaded(run_dir: Path, precision: str, runtime: str):
    import dataclasses

    from pipeline.checks import load_config
    from pipeline.evaluation import predictions

    cfg = load_config(run_dir / "config.yaml", [f"run_folder={run_dir}", f"eval.precision={precision}",
                                                 f"eval.runtime={runtime}"])
    return predictions.load(dataclasses.replace(cfg, eval=dataclasses.replace(cfg.eval, checkpoint="final")))


def throughput(run_dir: Path, rows: int, repeats: int, tmp: Path) -> None:
    from bench_inference_pipeline import load_tweets
    from transformers import pipeline

    from pipeline.data.stages import clean
    from pipeline.evaluation import inputs, predictions

    texts = load_tweets(rows)
    src = tmp / "tweets.jsonl"
    src.write_text("".join(json.dumps({"id": f"t{i}", "text": t}) + "\n" for i, t in enumerate(texts)), encoding="utf-8")
    variants = {f"predict.py {p}, {r}": _loaded(run_dir, p, r) for p, r in
                (("fp32", "torch"), ("bf16", "torch"), ("int8", "torch"), ("fp32", "onnxruntime"), ("int8", "onnxruntime"))}
    first = next(iter(variants.values()))
    source = inputs.source_for(first.cfg.source, src, {})
    cleaned, reasons = clean.clean_texts(texts, first.cfg.clean)
    kept = [t for t, r in zip(cleaned, reasons) if not r]
    import torch

    pipes = {"transformers.pipeline, batch_size=64": pipeline("text-classification", model=str(run_dir / "final"),
                                                              device=-1),
             "transformers.pipeline bf16 (dtype=torch.bfloat16), batch_size=64": pipeline(
                 "text-classification", model=str(run_dir / "final"), device=-1, dtype=torch.bfloat16)}
    times = {name: [] for name in [*pipes, *variants]}
    labels = {}
    for k in range(repeats + 1):  # the first round warms up (ONNX exports, first-call allocations): not timed
        for name in times:
            start = time.perf_counter()
            if name in pipes:
                out = pipes[name](kept, batch_size=64, truncation=True, max_length=64)
                labels[name] = [o["label"] for o in out]
            else:
                dest = tmp / f"out-{k}-{len(labels)}.jsonl"
                predictions.predict_file(variants[name], src, dest, source, 16 * 2**20, progress=False)
                labels[name] = [r["label"] for r in map(json.loads, dest.read_text().splitlines()) if "label" in r]
                dest.unlink()
            if k:
                times[name].append(time.perf_counter() - start)
    base = len(kept) / statistics.median(times["transformers.pipeline, batch_size=64"])
    reference = labels["transformers.pipeline, batch_size=64"]
    print(f"\n{len(texts)} tweets ({len(kept)} kept by clean), max_length 64, median of {repeats} interleaved repeats\n")
    print("| method | examples/s | vs pipeline() | same label as pipeline() |")
    print("|---|---:|---:|---:|")
    for name, t in times.items():
        rate = len(kept) / statistics.median(t)
        agree = float(np.mean([a == b for a, b in zip(labels[name], reference)]))
        print(f"| {name} | {rate:.1f} | {rate / base:.2f}x | {agree:.1%} |")


def write_long_docs(path: Path, megabytes: float, doc_kb: int) -> int:
    """A JSONL of documents of ~doc_kb KiB each (tweets joined) up to `megabytes` MiB; returns the documents."""
    from bench_inference_pipeline import load_tweets

    tweets = load_tweets(20000)
    rng = np.random.default_rng(0)
    target, n = int(megabytes * 2**20), 0
    with open(path, "w", encoding="utf-8") as f:
        while f.tell() < target:
            words, size = [], 0
            while size < doc_kb * 1024:
                t = tweets[int(rng.integers(len(tweets)))]
                words.append(t)
                size += len(t) + 1
            f.write(json.dumps({"id": f"d{n}", "text": " ".join(words)}) + "\n")
            n += 1
    return n


def _child(cmd: list[str], kill_at: float | None, progress: Path) -> tuple[int, float, float]:
    """Run `cmd` under /usr/bin/time; SIGKILL it once the progress record says `kill_at` of the parts are done.
    (exit code, seconds, its peak RSS in MiB). time's report, not this process's getrusage: a child forked from this
    large process (the pipelines of part (a) loaded) keeps the parent's high-water mark across exec."""
    start = time.perf_counter()
    rss_file = progress.with_name("rss.txt")
    proc = subprocess.Popen(["/usr/bin/time", "-o", str(rss_file), "-f", "%M", *cmd], cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts, killed = _parts_of(cmd), None
    while proc.poll() is None:
        if kill_at is not None and killed is None and progress.is_file():
            try:
                done = json.loads(progress.read_text()).get("parts", 0)
            except ValueError:
                done = 0
            if done >= kill_at * parts:
                killed = int(subprocess.check_output(["pgrep", "-P", str(proc.pid)]).split()[0])  # predict.py
                os.kill(killed, signal.SIGKILL)
        time.sleep(0.2)
    rss = int(rss_file.read_text().split()[-1]) / 1024  # KiB
    return (-signal.SIGKILL if killed else proc.returncode), time.perf_counter() - start, rss


def _parts_of(cmd: list[str]) -> int:
    path = Path(cmd[cmd.index("--input") + 1])
    return max(1, -(-path.stat().st_size // int(float(cmd[cmd.index("--part-mb") + 1]) * 2**20)))


def big_input(run_dir: Path, megabytes: float, doc_kb: int, runtime: list[str], tmp: Path, part_mb: float) -> None:
    src, out = tmp / "big.jsonl", tmp / "big.out.jsonl"
    start = time.perf_counter()
    docs = write_long_docs(src, megabytes, doc_kb)
    print(f"\nwrote {src.stat().st_size / 2**20:.0f} MiB, {docs} documents of ~{doc_kb} KiB, in "
          f"{time.perf_counter() - start:.0f} s")
    cmd = [sys.executable, str(REPO / "pipeline" / "predict.py"), "--run", str(run_dir), "--input", str(src),
           "--output", str(out), "--quiet", "--part-mb", str(part_mb), *runtime, "source.id_field=id"]
    progress = out.with_name(out.name + ".progress.json")
    rc1, t1, rss1 = _child(cmd, 0.5, progress)
    done = json.loads(progress.read_text())["parts"] if progress.is_file() else None
    rc2, t2, rss2 = _child(cmd, None, progress)
    ids = [json.loads(line)["id"] for line in out.open(encoding="utf-8")]
    exact = ids == [f"d{i}" for i in range(docs)]
    print(f"| {src.stat().st_size / 2**20:.0f} MiB | {docs} | killed (rc {rc1}) after {done} of {_parts_of(cmd)} parts, "
          f"{t1:.0f} s | resumed (rc {rc2}), {t2:.0f} s | {rss1:.0f} / {rss2:.0f} MiB | {len(ids)} rows, every id once "
          f"and in order: {exact} |")
    src.unlink()
    out.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--big-mb", type=float, default=1024)
    parser.add_argument("--small-mb", type=float, default=64, help="the smaller input, for peak RSS against size")
    parser.add_argument("--doc-kb", type=int, default=64)
    parser.add_argument("--part-mb", type=float, default=16, help="predict.py --part-mb")
    parser.add_argument("--skip", choices=("throughput", "big"), help="leave one part out")
    parser.add_argument("--run", help="a finished run of configs/default.yaml to use instead of training one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_predict-") as tmp:
        tmp = Path(tmp)
        run_dir = Path(args.run) if args.run else make_run(tmp / "run")
        if args.skip != "throughput":
            throughput(run_dir, args.rows, args.repeats, tmp)
        if args.skip != "big":
            print("\n| input | documents | first process | second process | peak RSS (first / second) | output |")
            print("|---|---:|---|---|---:|---|")
            for mb in (args.small_mb, args.big_mb):
                big_input(run_dir, mb, args.doc_kb, ["--precision", "int8", "--runtime", "onnxruntime"], tmp,
                          args.part_mb)


if __name__ == "__main__":
    main()
