"""Check that the working tree behaves exactly like a base commit (a refactor changed no behaviour).

    python scripts/check_equivalence.py [--base 13532df] [--configs tiny default ...] [--train tiny default ...] [--short]
                                        [--skip-train] [--keep]

What it proves, for the working tree ("current") against the base commit ("base", checked out in a
temporary `git worktree`), each run from its own tree root with PYTHONPATH set to that tree (the base
tree's own `pipeline` package is imported, not the editable install; checked first):

1. prepare (every config in --configs): every stage writes the same bytes. Stage folders are
   `<output_dir>/data/stages/<k>-<name>-<fingerprint>`; the fingerprints differ (they hash the code),
   so stages are paired by `<k>-<name>`. Compared by sha256: every `*.arrow`, `dataset_info.json` and
   `dataset_dict.json` under `<stage>/data/`, every file of `<stage>/tokenizer/`, and the stage's side
   files (clusters.jsonl, leakage.jsonl, ...). Not compared: datasets' `state.json` (it holds a random
   `_fingerprint`) and `manifest.json` (fingerprints, times).
2. train + evaluate (the configs in --train, tiny by default; skipped with --skip-train): `run/final/model.safetensors` is the same
   bytes (tensors compared too when it is not); metrics.jsonl's training curve (losses, learning rates,
   gradient norms, validation metrics) and the test split's `metrics.json` have the same values,
   timings, paths, versions and fingerprints left out.
3. resume (tiny): a checkpoint written by the base code resumes on the current code to the same final
   weights. The base run's output folder is copied, run/final, run/eval and every checkpoint after the
   newest intermediate one are removed (an interruption after that checkpoint's save), the current
   code prepares into the copy (new stage folders beside the base ones) and trains with --resume auto.
   Its final model.safetensors must be the bytes of the base code's uninterrupted run.

Exits 0 when everything is equal, 1 when anything differs or a command failed (its last error lines
are printed in the table), 2 when a tree cannot be set up. Temporary folders (the worktree, the output
folders and every command's log) are removed at the end unless --keep; the output folders and logs are
kept when something differed, and the paths printed. About 5 minutes on 2 CPU cores for both configs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# every config of configs/ whose data installs offline (imdb.yaml reads the IMDB release from disk: not here)
CONFIGS = {name: f"configs/{name}.yaml" for name in ("tiny", "default", "scratch_bpe", "pairs", "multilabel",
                                                     "regression", "shakespeare", "smollm2_shakespeare", "smollm2_chat")}
RESUME_CONFIG = "tiny"  # the config whose base checkpoint is resumed on the current code (seconds on a CPU)
# --short: the training of a config other than tiny cut to a few steps, a validation and a checkpoint among them;
# the same overrides in both trees, so what is compared is still one code against the other
SHORT = ["train.max_steps=6", "train.eval_every=3", "train.save_every=3", "train.max_minutes=0"]
SHORT_RUNS = False  # --short
ACCELERATE_CONFIG = "accelerate_config.yaml"  # one CPU process (the README's launch command)
COMMAND_TIMEOUT_S = 1800

# stage files: compared by name inside <stage>/data/, never compared anywhere in the stage
DATA_FILES = ("dataset_info.json", "dataset_dict.json")
NEVER_COMPARED = ("state.json", "manifest.json")
# fields of metrics.json / metrics.jsonl that are not behaviour: timings, paths, versions, fingerprints
IGNORED_FIELDS = {"seconds", "examples_per_second", "tokens_per_s", "samples_per_s", "checkpoint_path",
                  "output_dir", "final", "versions", "onnx_export", "started", "argv"}


class SetupFailed(Exception):
    """A tree cannot be set up (bad commit, `pipeline` imported from the wrong place): exit 2."""


class CommandFailed(Exception):
    """A pipeline command exited non-zero; the message is its last error lines."""


@dataclass
class Row:
    config: str
    check: str
    compared: str  # files or values compared
    equal: bool | None  # None: could not be compared (a command failed)
    detail: str = ""

    @property
    def verdict(self) -> str:
        return {True: "yes", False: "NO"}.get(self.equal, "ERROR")


@dataclass
class Tree:
    """A source tree (the base worktree or this checkout) and how its commands are run."""

    label: str
    root: Path
    logs: Path

    def env(self) -> dict:
        env = dict(os.environ)
        env["PYTHONPATH"] = str(self.root)  # this tree's `pipeline`, before the editable install's finder
        env["HF_DATASETS_CACHE"] = str(self.logs.parent / f"hf-datasets-{self.label}")  # no cache shared by trees
        env.pop("PYTHONSTARTUP", None)
        return env

    def run(self, name: str, args: list[str], timeout: int = COMMAND_TIMEOUT_S) -> str:
        """Run `python <args>` from the tree root; the output goes to a log file, returned as text.
        CommandFailed (with the last error lines) when it exits non-zero."""
        log = self.logs / f"{self.label}-{name}.log"
        cmd = [sys.executable, *args]
        start = time.perf_counter()
        with open(log, "w", encoding="utf-8") as f:
            f.write(f"$ cd {self.root} && PYTHONPATH={self.root} {' '.join(cmd)}\n\n")
            f.flush()
            try:
                proc = subprocess.run(cmd, cwd=self.root, env=self.env(), stdout=f, stderr=subprocess.STDOUT,
                                      timeout=timeout, stdin=subprocess.DEVNULL)
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = f"timeout after {timeout}s"
        text = log.read_text(encoding="utf-8", errors="replace")
        print(f"  [{self.label}] {name}: {time.perf_counter() - start:.0f}s, "
              f"{'ok' if code == 0 else f'FAILED ({code})'} (log {log})", flush=True)
        if code != 0:
            raise CommandFailed(f"{self.label} {name} exited {code}: {last_error(text)}")
        return text


def last_error(text: str, lines: int = 3) -> str:
    """What went wrong, from a command's output: the last line that reads as an error (a traceback's
    final line, `error: ...`) and the lines after it; else the output's last lines."""
    tail = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i in range(len(tail) - 1, -1, -1):
        if tail[i].lower().startswith("error") or "Error:" in tail[i] or "Exception:" in tail[i]:
            return " | ".join(tail[i:i + lines])
    return " | ".join(tail[-lines:])


# ------------------------------------------------------------------------------------------ set-up


def add_worktree(base: str, dest: Path) -> Path:
    """A detached worktree of `base` at `dest` (commit checked: a typo fails here, not later)."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{base}^{{commit}}"],
                            capture_output=True, text=True)
    if commit.returncode != 0:
        raise SetupFailed(f"{base!r} is not a commit of {REPO}: {commit.stderr.strip()}")
    added = subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(dest), base],
                           capture_output=True, text=True)
    if added.returncode != 0:
        raise SetupFailed(f"git worktree add {dest} {base} failed: {added.stderr.strip()}")
    return dest


def remove_worktree(dest: Path) -> None:
    result = subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(dest)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        print(f"warning: could not remove worktree {dest}: {result.stderr.strip()}", file=sys.stderr)


def check_imports(tree: Tree) -> None:
    """`import pipeline` must resolve inside the tree, from its root and from elsewhere (PYTHONPATH alone)."""
    for cwd in (tree.root, Path("/")):
        out = subprocess.run([sys.executable, "-c", "import pipeline; print(pipeline.__file__)"], cwd=cwd,
                             env=tree.env(), capture_output=True, text=True)
        where = Path(out.stdout.strip() or "?").resolve()
        if out.returncode != 0 or not where.is_relative_to(tree.root.resolve()):
            raise SetupFailed(f"in the {tree.label} tree (cwd {cwd}) `import pipeline` gives {where} "
                             f"instead of a file under {tree.root}: {out.stderr.strip()[-300:]}")
    print(f"  [{tree.label}] pipeline imported from {where}", flush=True)


# ------------------------------------------------------------------------------------------ files


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stage_folders(output_dir: Path) -> dict[str, Path]:
    """`<k>-<name>` -> its complete stage folder (the fingerprint suffix dropped). With several folders
    for one stage (a copied run prepared again) the newest wins."""
    found: dict[str, Path] = {}
    root = output_dir / "data" / "stages"
    for folder in sorted(root.iterdir(), key=lambda p: p.stat().st_mtime) if root.is_dir() else []:
        if folder.is_dir() and not folder.name.startswith(".") and (folder / "manifest.json").is_file():
            found[folder.name.rsplit("-", 1)[0]] = folder
    return dict(sorted(found.items(), key=lambda kv: int(kv[0].split("-", 1)[0])))


def stage_files(stage: Path) -> dict[str, str]:
    """relative path -> sha256 of every file that is the stage's output (see the module docstring)."""
    files = {}
    for p in sorted(stage.rglob("*")):
        if not p.is_file() or p.name in NEVER_COMPARED:
            continue
        rel = p.relative_to(stage)
        top = rel.parts[0]
        if top == "data" and not (p.name.endswith(".arrow") or p.name in DATA_FILES):
            continue  # e.g. datasets' cache-*.arrow are .arrow and compared; anything else in data/ is not output
        if top not in ("data", "tokenizer") and len(rel.parts) > 1:
            continue  # a stage's own scratch sub-folder: not an output
        files[str(rel)] = sha256(p)
    return files


def compare_file_sets(a: dict[str, str], b: dict[str, str]) -> tuple[bool, str]:
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    differ = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    notes = []
    if differ:
        notes.append("differ: " + ", ".join(differ[:4]) + (" ..." if len(differ) > 4 else ""))
    if only_a:
        notes.append("only in base: " + ", ".join(only_a[:4]))
    if only_b:
        notes.append("only in current: " + ", ".join(only_b[:4]))
    return not notes, "; ".join(notes)


def compare_prepare(config: str, base_out: Path, cur_out: Path) -> list[Row]:
    base_stages, cur_stages = stage_folders(base_out), stage_folders(cur_out)
    if not base_stages:
        return [Row(config, "prepare", "0", False, f"no stage folders in {base_out}/data/stages")]
    rows = []
    for key in sorted(set(base_stages) | set(cur_stages), key=lambda k: int(k.split("-", 1)[0])):
        if key not in base_stages or key not in cur_stages:
            where = "base" if key in base_stages else "current"
            rows.append(Row(config, f"prepare {key}", "-", False, f"stage only in {where}"))
            continue
        a, b = stage_files(base_stages[key]), stage_files(cur_stages[key])
        equal, detail = compare_file_sets(a, b)
        rows.append(Row(config, f"prepare {key}", str(len(set(a) | set(b))), equal, detail))
    return rows


def compare_weights(config: str, check: str, a: Path, b: Path) -> Row:
    """model.safetensors: the same bytes; when not, whether the tensors are at least bit-equal."""
    for p in (a, b):
        if not p.is_file():
            return Row(config, check, "0", False, f"{p} does not exist")
    if sha256(a) == sha256(b):
        return Row(config, check, "1", True, f"sha256 {sha256(a)[:12]}")
    from safetensors.torch import load_file
    import torch

    ta, tb = load_file(str(a)), load_file(str(b))

    def bits(t):
        return t.contiguous().reshape(-1).view(torch.uint8)

    differ = sorted(k for k in set(ta) & set(tb)
                    if ta[k].dtype != tb[k].dtype or ta[k].shape != tb[k].shape or not torch.equal(bits(ta[k]), bits(tb[k])))
    keys = set(ta) ^ set(tb)
    if not differ and not keys:
        return Row(config, check, "1", False, "bytes differ (header), every tensor bit-equal")
    worst = max((float((ta[k].float() - tb[k].float()).abs().max()) for k in differ
                 if ta[k].shape == tb[k].shape), default=float("nan"))
    return Row(config, check, "1", False, f"{len(differ)}/{len(ta)} tensors differ (max abs diff {worst:.3g})"
               + (f"; keys in one only: {sorted(keys)[:3]}" if keys else ""))


# ------------------------------------------------------------------------------------------ metrics


def comparable(value):
    """A metrics record without the fields that are not behaviour (IGNORED_FIELDS, *fingerprint*)."""
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items() if k not in IGNORED_FIELDS and "fingerprint" not in k}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value


def leaves(value, prefix: str = "") -> dict[str, object]:
    """Flatten to path -> scalar, for counting and naming what differs."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list):
        out = {}
        for i, v in enumerate(value):
            out.update(leaves(v, f"{prefix}[{i}]"))
        return out
    return {prefix: value}


def compare_values(config: str, check: str, a, b) -> Row:
    la, lb = leaves(comparable(a)), leaves(comparable(b))
    differ = sorted(k for k in set(la) | set(lb) if la.get(k, "<absent>") != lb.get(k, "<absent>"))
    detail = "; ".join(f"{k}: {la.get(k, '<absent>')!r} vs {lb.get(k, '<absent>')!r}" for k in differ[:3])
    return Row(config, check, f"{len(set(la) | set(lb))} values", not differ,
               (f"{len(differ)} differ: " + detail) if differ else "")


def read_jsonl(path: Path) -> list:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


# ------------------------------------------------------------------------------------------ commands


def prepare(tree: Tree, config: str, out: Path) -> str:
    return tree.run(f"prepare-{config}-{out.name}", ["pipeline/prepare.py", "--config", CONFIGS[config],
                                                     f"output_dir={out}", "--quiet"])


def run_overrides(config: str) -> list[str]:
    """The overrides of a training and its evaluation: SHORT under --short, for every config but tiny."""
    return SHORT if SHORT_RUNS and config != "tiny" else []


def train(tree: Tree, config: str, out: Path, resume: str | None = None) -> str:
    args = ["-m", "accelerate.commands.launch", "--config_file", ACCELERATE_CONFIG, "pipeline/train.py",
            "--config", CONFIGS[config], f"output_dir={out}", *run_overrides(config)]
    return tree.run(f"train-{config}-{out.name}", args + (["--resume", resume] if resume else []))


def evaluate(tree: Tree, config: str, out: Path) -> Path:
    tree.run(f"evaluate-{config}-{out.name}", ["pipeline/evaluate.py", "--config", CONFIGS[config], "--split", "test",
                                               f"output_dir={out}", "--quiet", *run_overrides(config)])
    found = sorted((out / "run" / "eval").glob("test-*/metrics.json"))
    if not found:
        raise CommandFailed(f"{tree.label} evaluate wrote no {out}/run/eval/test-*/metrics.json")
    return found[0]


def simulate_interruption(src: Path, dst: Path) -> tuple[int, int, list[str]]:
    """Copy a finished run and cut it back to its newest intermediate checkpoint: remove run/final,
    run/eval and every checkpoint saved after it, as if the process died just after that checkpoint's
    save. metrics.jsonl, run_info.json and the TensorBoard files stay (a resume trims metrics.jsonl).
    Returns (the checkpoint's step, the final step, the folders removed)."""
    shutil.copytree(src, dst, symlinks=True)
    run = dst / "run"
    steps = {}
    for p in (run / "checkpoints").iterdir():
        if p.is_dir() and not p.name.startswith(".") and (p / "state.json").is_file():
            steps[p] = json.loads((p / "state.json").read_text(encoding="utf-8"))["step"]
    final_step = json.loads((run / "final" / "state.json").read_text(encoding="utf-8"))["step"]
    earlier = [s for s in steps.values() if s < final_step]
    if not earlier:
        raise CommandFailed(f"no checkpoint before the final step {final_step} in {run / 'checkpoints'}: "
                            f"{sorted(steps.values())}")
    resume_step = max(earlier)
    removed = []
    for p, s in steps.items():
        if s > resume_step:
            shutil.rmtree(p)
            removed.append(f"checkpoints/{p.name}")
    for name in ("final", "eval"):
        if (run / name).exists():
            shutil.rmtree(run / name)
            removed.append(name)
    return resume_step, final_step, removed


def resumed_from(run: Path) -> str | None:
    """run_info.json's last launch: the checkpoint it resumed from."""
    try:
        return json.loads((run / "run_info.json").read_text(encoding="utf-8"))["launches"][-1].get("resumed_from")
    except (OSError, ValueError, KeyError, IndexError):
        return None


# ------------------------------------------------------------------------------------------ phases


def check_prepare(trees: dict[str, Tree], config: str, work: Path) -> tuple[list[Row], dict[str, Path]]:
    outs = {label: work / f"{label}-{config}" for label in trees}
    try:
        for label, tree in trees.items():
            prepare(tree, config, outs[label])
    except CommandFailed as e:
        return [Row(config, "prepare", "-", None, str(e))], outs
    return compare_prepare(config, outs["base"], outs["current"]), outs


def check_train(trees: dict[str, Tree], config: str, outs: dict[str, Path]) -> list[Row]:
    """Train and evaluate in both trees; compare the final weights, the training curve and the metrics."""
    metrics = {}
    try:
        for label, tree in trees.items():
            train(tree, config, outs[label])
            metrics[label] = evaluate(tree, config, outs[label])
    except CommandFailed as e:
        return [Row(config, "train + evaluate", "-", None, str(e))]
    run = {label: out / "run" for label, out in outs.items()}
    curve = {label: read_jsonl(r / "metrics.jsonl") for label, r in run.items()}
    return [
        compare_weights(config, "train final/model.safetensors", run["base"] / "final" / "model.safetensors",
                        run["current"] / "final" / "model.safetensors"),
        compare_values(config, "train metrics.jsonl", curve["base"], curve["current"]),
        compare_values(config, "evaluate test metrics.json", json.loads(metrics["base"].read_text()),
                       json.loads(metrics["current"].read_text())),
    ]


def check_resume(trees: dict[str, Tree], config: str, outs: dict[str, Path], work: Path) -> list[Row]:
    """A base checkpoint, resumed by the current code, must end on the base run's final weights."""
    copy = work / f"resume-{config}"
    try:
        step, final_step, removed = simulate_interruption(outs["base"], copy)
        print(f"  resume: copied the base run to {copy}, removed {', '.join(removed)}; "
              f"newest checkpoint now at step {step} of {final_step}", flush=True)
        prepare(trees["current"], config, copy)
        train(trees["current"], config, copy, resume="auto")
    except CommandFailed as e:
        return [Row(config, "resume base checkpoint on current", "-", None, str(e))]
    row = compare_weights(config, f"resume base step {step} -> current", copy / "run" / "final" / "model.safetensors",
                          outs["base"] / "run" / "final" / "model.safetensors")
    origin = resumed_from(copy / "run")
    if origin is None or not Path(origin).name.endswith(f"{step:07d}"):
        row.equal, row.detail = False, f"did not resume from step {step} (resumed_from: {origin}); " + row.detail
    else:
        row.detail = f"resumed from {Path(origin).name}; vs base full run: {row.detail}"
    return [row]


# ------------------------------------------------------------------------------------------ report


def print_table(rows: list[Row]) -> None:
    head = ("config", "check", "compared", "equal", "detail")
    cells = [(r.config, r.check, r.compared, r.verdict, r.detail) for r in rows]
    widths = [max(len(head[i]), *(len(c[i]) for c in cells)) for i in range(4)]
    line = "  ".join(h.ljust(w) for h, w in zip(head, widths)) + "  " + head[4]
    print(line)
    print("-" * min(len(line) + 40, 140))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths)) + "  " + c[4])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", default="13532df", help="the commit to compare against (default 13532df)")
    p.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=["tiny", "default"],
                   help="configs to prepare in both trees (default: tiny default)")
    p.add_argument("--train", nargs="+", choices=sorted(CONFIGS), default=["tiny"],
                   help="configs also trained and evaluated in both trees (default: tiny; default takes ~6 min a tree)")
    p.add_argument("--skip-train", action="store_true", help="prepare only: no train, evaluate or resume check")
    p.add_argument("--short", action="store_true", help=f"train every config but tiny for a few steps only ({' '.join(SHORT)})")
    p.add_argument("--keep", action="store_true", help="keep the temporary folders (worktree, outputs, logs)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    global SHORT_RUNS
    args = parse_args(argv)
    SHORT_RUNS = args.short
    started = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="check-equivalence-"))
    worktree = Path(tempfile.mkdtemp(prefix="check-equivalence-base-")) / "tree"
    logs = work / "logs"
    logs.mkdir()
    rows: list[Row] = []
    print(f"base {args.base} in {worktree}; current {REPO}; outputs and logs in {work}", flush=True)
    try:
        add_worktree(args.base, worktree)
        corpora = REPO / "data" / "corpora"  # the configs' corpora made by scripts/setup.sh (git-ignored): one input
        if corpora.is_dir():
            shutil.copytree(corpora, worktree / "data" / "corpora")
        trees = {"base": Tree("base", worktree, logs), "current": Tree("current", REPO, logs)}
        for tree in trees.values():
            check_imports(tree)
        for config in args.configs:
            print(f"{config}: prepare", flush=True)
            prepare_rows, outs = check_prepare(trees, config, work)
            rows += prepare_rows
            if config in args.train and not args.skip_train:
                if any(r.equal is None for r in prepare_rows):
                    rows.append(Row(config, "train + evaluate + resume", "-", None, "skipped: prepare failed"))
                    continue
                print(f"{config}: train + evaluate", flush=True)
                train_rows = check_train(trees, config, outs)
                rows += train_rows
                if config == RESUME_CONFIG and (outs["base"] / "run" / "final" / "model.safetensors").is_file():
                    print(f"{config}: resume a base checkpoint with the current code", flush=True)
                    rows += check_resume(trees, config, outs, work)
    except SetupFailed as e:
        print(f"error: {e}", file=sys.stderr)
        print(f"kept: {work} (logs/)", file=sys.stderr)
        return 2
    finally:
        if worktree.exists():
            remove_worktree(worktree)
        shutil.rmtree(worktree.parent, ignore_errors=True)
    ok = bool(rows) and all(r.equal for r in rows)
    print()
    print_table(rows)
    print(f"\n{'EQUIVALENT' if ok else 'DIFFERENCES OR ERRORS FOUND'}: {sum(bool(r.equal) for r in rows)}/{len(rows)} "
          f"checks equal; {time.perf_counter() - started:.0f}s in all")
    if args.keep or not ok:
        print(f"kept: {work} (outputs, logs/)")
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
