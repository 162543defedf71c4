"""The prepare runner: the stage table, fingerprint-keyed caching, manifests and the report.

Stage k's directory is `<data_dir>/stages/<k>-<name>-<fingerprint>`, where the fingerprint covers
the stage's config sections, the source of its code and the fingerprint of its input. A complete
directory (manifest present) is reused without loading anything; the first stage whose directory
is missing (or forced) and every stage after it run again.

"The source of its code" is the stage function's module and every module inside `pipeline/` that it
imports, directly or through others, at the top or inside a function (read from the source files'
import statements, not from a list kept by hand), so editing any helper a stage uses reruns it. The
config's modules are not code a stage runs: its section's values are in the key already, so a help
string or another section's default changes no stage.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator

import pipeline
from pipeline import artifacts, cli
from pipeline.config import Config, pretrained_tokenizer_name
from pipeline.data.content import content_fingerprint
from pipeline.data.engines.base import Stage, StageContext, StageFailed  # noqa: F401 - StageFailed: prepare.py's
from pipeline.data.engines.local import LocalEngine
from pipeline.data.engines.ops import num_rows
from pipeline.data.io import conversation, pair, references
from pipeline.data.stages import clean, dedup, load, split, tokenize
from pipeline.task import Task

PREPARED = "prepared.json"
SECTION_OF = {"load": "source"}  # the config section of a stage not named after it


def stage_table(cfg: Config, task: Task) -> list[Stage]:
    """The pipeline, in order. Reads like a table of contents: the stages every task shares up to split,
    then the task's (`task`, the one cfg.task names; its stages place the shared tokenize stage among their own)."""
    tok = cfg.tokenize
    if tok.kind == "pretrained":  # the tokenizer a name means is the section's (model.name_or_path when empty)
        tok = dataclasses.replace(tok, pretrained=pretrained_tokenizer_name(cfg))
    return [
        Stage("load", load.load, cfg.source),
        Stage("clean", clean.clean, cfg.clean),
        Stage("dedup", dedup.dedup, cfg.dedup),
        # the leakage check: ctx.similarity; the contamination check: the evaluation files' bytes; a task's strata
        Stage("split", split.split, cfg.split, uses=(cfg.dedup, *_evaluation_files(cfg), *_strata_uses(cfg, task))),
        *task.stages(cfg, Stage("tokenize", tokenize.tokenize, tok)),  # classification: label, tokenize
    ]


def _task_strata(cfg: Config, task: Task) -> Callable | None:
    """The task's strata (Task.strata) where the split is stratified and the task has them."""
    return task.strata if task.strata is not None and cfg.split.stratify else None


def strata(cfg: Config, task: Task) -> Callable | None:
    """The split stage's ctx.strata: the task's strata bound to the config."""
    fn = _task_strata(cfg, task)
    return functools.partial(fn, cfg) if fn is not None else None


def _strata_uses(cfg: Config, task: Task) -> tuple:
    """What a task's strata make the split depend on: the task, its own sections (Task.sections) and the strata's
    code."""
    fn = _task_strata(cfg, task)
    sections = tuple(getattr(cfg, name) for name in task.sections)
    return (cfg.task, *sections, code_fingerprint(fn)) if fn is not None else ()


def _evaluation_files(cfg: Config) -> tuple:
    files = list(cfg.split.contamination_files) if cfg.split.contamination != "off" else []
    return (references.fingerprint(files),) if files else ()


PACKAGE_ROOT = Path(pipeline.__file__).parent


def _module_file(name: str, root: Path) -> Path | None:
    """The file of `pipeline.a.b` under `root`; None for a name that is not a module (an attribute)."""
    base = root.joinpath(*name.split(".")[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_names(path: Path) -> list[str]:
    """Names of pipeline modules (or their attributes) that a file imports, anywhere in it."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return [n for n in names if n == "pipeline" or n.startswith("pipeline.")]


CONFIG_MODULES = ("pipeline.schema", "pipeline.config")  # the sections' declarations and loader, not a stage's code


def code_files(module: str, root: Path = PACKAGE_ROOT) -> list[Path]:
    """`module`'s file and those of every pipeline module it imports, transitively, sorted (the config's
    modules left out: a stage's section values are in its fingerprint, its help strings change nothing)."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        skip = name in seen or name in CONFIG_MODULES or name.rpartition(".")[0] in CONFIG_MODULES
        path = None if skip else _module_file(name, root)
        if path is not None:
            seen[name] = path
            todo += _imported_names(path)
    return sorted(seen.values())


def code_fingerprint(fn: Callable, root: Path = PACKAGE_ROOT) -> str:
    """Hash of the source of a stage function's module and everything inside pipeline/ it imports."""
    files = code_files(fn.__module__, root)
    return artifacts.fingerprint([(str(p.relative_to(root)), p.read_text(encoding="utf-8")) for p in files])


def data_config_fingerprint(cfg: Config, task: Task) -> str:
    """Fingerprint of every setting that shapes the prepared data (not the source bytes): each stage's settings as
    its own fingerprint takes them, so a task's keys count (causal_lm's lm.block_size) and no other key does."""
    return artifacts.fingerprint([_config_dicts(stage.config) for stage in stage_table(cfg, task)], cfg.task)


NOT_IN_FINGERPRINT = ("num_proc",)  # how a stage runs, not what it produces (same output, tested); the
# prepare and ray sections (the engine, its processes, blocks, cluster) are in no stage's config at all


def _config_dicts(values: tuple) -> list:
    """The config sections as dicts, less the fields that cannot change a stage's output."""
    out = []
    for v in values:
        d = asdict(v) if hasattr(v, "__dataclass_fields__") else v
        out.append({k: x for k, x in d.items() if k not in NOT_IN_FINGERPRINT} if isinstance(d, dict) else d)
    return out


def check_before_stages(cfg: Config, table: list) -> None:
    """What prepare checks of its settings before the first stage, beyond the config's own checks: a mistyped
    tokenizer path, and a head_tail truncation that cannot fit tokenize.max_length, fail now, not after five
    stages. (tests/test_docs_commands.py runs it on every prepare command the docs show.)"""
    names = [stage.name for stage in table]
    if cfg.tokenize.kind == "pretrained":
        tokenize.local_tokenizer(pretrained_tokenizer_name(cfg))
    if "tokenize" in names:
        section = table[names.index("tokenize")].section
        tokenize.check_head_tail(getattr(section, "tokenize", section))  # causal_lm's: tokenize settings + lm


def run(cfg: Config, task: Task, force: bool = False, from_stage: str | None = None,
        progress: bool = True) -> list[dict]:
    """Run (or reuse) every stage of `cfg` and its task (`task`, the one cfg.task names); return one report row per
    stage."""
    table = stage_table(cfg, task)
    names = [stage.name for stage in table]
    if from_stage is not None and from_stage not in names:
        raise ValueError(f"--from {from_stage!r} is not a stage of task {cfg.task}; stages: {', '.join(names)}")
    first_forced = 0 if force else (names.index(from_stage) if from_stage else len(names))
    stages_root = cfg.data_dir / "stages"
    for folder in (stages_root, cfg.data_dir):  # stage folders; prepared.json and report.json
        artifacts.remove_stale_temporaries(folder)
    _check_output_outside_input(cfg)
    input_fp = load.fingerprint(cfg.source)
    check_before_stages(cfg, table)
    with open_engine(cfg) as engine:
        data_dir, manifests, rows = _run_stages(cfg, table, strata(cfg, task), engine, input_fp, first_forced,
                                                progress)
    last = names[-1]
    prepared = {
        "stage_dir": str(data_dir.resolve()),
        "fingerprint": manifests[last]["fingerprint"],
        "content_fingerprint": stage_content(data_dir, manifests[last]),
        "config_fingerprint": data_config_fingerprint(cfg, task),
        "task": cfg.task,
        "data_info": task.data_info(manifests),
    }
    if all(r["cached"] for r in rows) and _json_or_none(cfg.data_dir / PREPARED) == prepared:
        return rows  # nothing changed, nothing written: a read-only output_dir serves a cached prepare
    artifacts.write_json_atomic(cfg.data_dir / PREPARED, prepared)
    artifacts.write_json_atomic(cfg.data_dir / "report.json", rows)
    return rows


def _json_or_none(path: Path) -> Any:
    try:
        return artifacts.read_json(path) if path.is_file() else None
    except ValueError:
        return None


def _run_stages(cfg: Config, table: list[Stage], strata_of: Callable | None, engine: Any, input_fp: str,
                first_forced: int, progress: bool):
    """Each stage of `table` reused or run, in order; returns the last stage's folder, the manifests, the report."""
    stages_root = cfg.data_dir / "stages"
    data, data_dir, rows, manifests = None, None, [], {}
    for k, stage in enumerate(table):
        fp = artifacts.fingerprint(stage.name, code_fingerprint(stage.fn), _config_dicts(stage.config), input_fp)
        out = stage_folder(stages_root, k, stage.name, fp)
        t0 = time.perf_counter()
        # a forced stage is replaced when its new copy is complete, never deleted first: a kill
        # in the middle of rmtree could leave its manifest next to half of its data
        man = _cached_manifest(out) if k < first_forced else None
        if man is not None:
            rows.append({**_row(man), "cached": True, "seconds": round(time.perf_counter() - t0, 3)})
            data = None  # loaded lazily, only if a later stage must run
        else:
            if data is None and data_dir is not None:
                data = load_stage(data_dir, table[k - 1].name)
            ctx = StageContext(out_dir=out, num_proc=cfg.prepare.num_proc, progress=progress,
                               engine=engine.get(), similarity=cfg.dedup,
                               conversations=conversation.conversational(cfg.source),
                               pairs=pair.paired(cfg.source), strata=strata_of)
            data, man = _run_stage(stage, data, out, fp, input_fp, ctx, data_dir)
            rows.append({**_row(man), "cached": False})
        input_fp, data_dir, manifests[stage.name] = fp, out, man
    return data_dir, manifests, rows


# Which engine runs the stages (prepare.engine), opened once per prepare and only when a stage has to run:
# a fully cached rerun never starts or joins Ray. No engine is part of a stage's fingerprint: the engines
# move data and call the stage's functions, and their outputs are equal (tested).


class _Opened:
    def __init__(self, cfg: Any):
        self.cfg, self.engine = cfg, None

    def get(self) -> Any:
        if self.engine is None:
            if self.cfg.prepare.engine == "ray":
                from pipeline.data.engines.ray.engine import RayEngine

                self.engine = RayEngine.connect(self.cfg.ray)
            else:
                self.engine = LocalEngine(self.cfg.prepare.num_proc)
        return self.engine

    def close(self) -> None:
        if hasattr(self.engine, "close"):
            self.engine.close()


@contextlib.contextmanager
def open_engine(cfg: Any) -> Iterator[_Opened]:
    """The engine of `cfg` (created by `.get()`); a Ray that this prepare started is stopped after."""
    opened = _Opened(cfg)
    try:
        yield opened
    finally:
        opened.close()


def stage_folder(stages_root: Path, k: int, name: str, fp: str) -> Path:
    """Where stage k (`name`) with fingerprint `fp` lives: the one owner of the layout."""
    return stages_root / f"{k}-{name}-{fp}"


def stage_manifests(stage_dir: Path) -> dict[str, dict]:
    """The manifests of a stage folder and of the stages that made its input, by stage name, walked
    back through their input fingerprints; the walk stops at a folder that is gone or incomplete."""
    found: dict[str, dict] = {}
    folder = stage_dir
    while folder is not None and artifacts.is_complete(folder):
        man = artifacts.read_json(folder / artifacts.MANIFEST)
        k = folder.name.split("-", 1)[0]
        if not isinstance(man.get("stage"), str) or not k.isdigit():
            break
        found[man["stage"]] = man
        if k == "0" or not man.get("input_fingerprint"):
            break
        folder = next(stage_dir.parent.glob(f"{int(k) - 1}-*-{man['input_fingerprint']}"), None)
    return found


def _check_output_outside_input(cfg: Config) -> None:
    """Stages written inside a source folder would change its fingerprint (and its classes) every run."""
    if cfg.source.format == "hub" and not Path(cfg.source.path).exists():
        return
    src = load.resolve_path(cfg.source).resolve()
    if src.is_dir() and cfg.data_dir.resolve().is_relative_to(src):
        raise ValueError(f"output_dir {cfg.output_dir} is inside source.path {src}: each run would change the input "
                         f"it reads; put output_dir outside it")


def stage_content(stage_dir: Path, man: dict) -> str:
    """A complete stage's content fingerprint: its manifest's, or computed (a folder from an older version)."""
    return man.get("content_fingerprint") or content_fingerprint(stage_dir)


def _cached_manifest(out: Path) -> dict | None:
    """The manifest of a complete stage whose content is what the manifest says; a stage damaged or changed
    on disk since it was written (manifest, data or side files) runs again, with a warning."""
    if not artifacts.is_complete(out):
        return None
    try:
        man = artifacts.read_json(out / artifacts.MANIFEST)
    except ValueError as e:
        print(f"warning: {e}; running the stage again", file=sys.stderr)
        return None
    problem = content_problem(out, man)
    if problem:
        print(f"warning: stage {out} {problem}; running the stage again", file=sys.stderr)
        return None
    return man


def content_problem(stage_dir: Path, man: dict) -> str | None:
    """None when a stage folder holds what its manifest's content_fingerprint says; else what is wrong."""
    try:
        found = content_fingerprint(stage_dir)
    except Exception as e:  # noqa: BLE001 - datasets and pyarrow raise many types for a folder they cannot read
        return f"cannot be read ({type(e).__name__}: {' '.join(str(e).split())[:200]})"
    if man.get("content_fingerprint") not in (None, found):
        return "does not hold what its manifest says (changed on disk since it was written)"
    return None


def _load(stage_dir: Path) -> Any:
    import datasets

    return datasets.load_from_disk(str(stage_dir / "data"))


def load_stage(stage_dir: Path, name: str, command: str = "") -> Any:
    """A complete stage from an earlier run; one that no longer loads (damaged on disk, or written
    by a version with a bug) is named with the command that rebuilds it."""
    try:
        return _load(stage_dir)
    except Exception as e:  # noqa: BLE001 - datasets raises many types for a folder it cannot read
        fix = f"`{command} --from {name}`" if command else f"--from {name}"
        raise ValueError(f"stage {stage_dir} cannot be read ({type(e).__name__}: {e}); rebuild it with {fix}") from None


def _check_readable(data: Any, name: str) -> None:
    """Splits with different columns are a stage's bug (datasets skips work on empty ones)."""
    if hasattr(data, "num_rows") and isinstance(data.num_rows, int):
        return
    features = {k: d.features for k, d in data.items()}
    if len({repr(f) for f in features.values()}) > 1:
        raise ValueError(f"stage '{name}' made splits with different columns, nothing was saved: {features}")


def _run_stage(stage: Stage, data: Any, out: Path, fp: str, input_fp: str, ctx: StageContext,
               input_dir: Path | None = None):
    import datasets

    datasets.disable_caching()  # stages cache themselves; no cache-*.arrow files inside earlier stages' dirs
    start = time.perf_counter()
    rows_in = num_rows(data) if data is not None else None
    try:
        return _write_stage(stage, data, out, fp, input_fp, ctx, input_dir, rows_in, start)
    except artifacts.write_errors() as e:  # the temporary is gone (atomic_dir); a full disk is said so
        if not artifacts.says_no_space(e):
            raise
        needed = artifacts.tree_bytes(input_dir / "data") if input_dir is not None else None  # about the input's size
        raise artifacts.no_space_error(out.parent, needed, f"stage {stage.name}", e) from None


def _write_stage(stage: Stage, data: Any, out: Path, fp: str, input_fp: str, ctx: StageContext,
                 input_dir: Path | None, rows_in: int | None, start: float):
    with artifacts.atomic_dir(out, replace=True) as tmp, ctx.engine.stage(tmp):  # Ray: its maps' shards under tmp
        ctx = dataclasses.replace(ctx, out_dir=tmp)
        result = stage.run(data, ctx)
        if num_rows(result.data) == 0:
            section = SECTION_OF.get(stage.name, stage.name)
            raise ValueError(
                f"stage '{stage.name}' left no rows (dropped: {result.dropped or 'none'}); "
                f"loosen its settings in the config's `{section}` section ({section}.*)"
            )
        # a stage that hands its input back (dedup.method=none) links the input stage's files: no copy
        if not (result.data is data and input_dir is not None and artifacts.link_tree(input_dir / "data", tmp / "data")):
            ctx.engine.save(result.data, tmp / "data")  # Ray: a shard per task
        written = _load(tmp)
        _check_readable(written, stage.name)  # a stage that cannot be read back is never marked complete
        content = content_fingerprint(tmp, written)  # what it holds, whichever code or engine wrote it
        man = artifacts.manifest(
            stage=stage.name,
            fingerprint=fp,
            content_fingerprint=content,
            input_fingerprint=input_fp,
            rows_in=rows_in if rows_in is not None else num_rows(result.data) + sum(result.dropped.values()),
            rows_out=num_rows(result.data),
            dropped=result.dropped,
            seconds=round(time.perf_counter() - start, 3),
            stats=result.stats,
            config=_config_dicts(stage.config),
        )
        cli.raise_if_interrupted()  # a Ctrl-C that a library swallowed mid-stage: the stage is not complete
        artifacts.write_json_atomic(tmp / artifacts.MANIFEST, man)  # written last: marks completeness
    return _load(out), man


def _row(man: dict) -> dict:
    return {
        "stage": man["stage"],
        "rows_in": man["rows_in"],
        "rows_out": man["rows_out"],
        "dropped": man["dropped"],
        "seconds": man["seconds"],
    }


def format_report(rows: list[dict]) -> str:
    """The table printed at the end of prepare."""
    header = f"{'stage':<9} {'rows in':>8} {'rows out':>9} {'time s':>7}  {'cached':<6}  dropped"
    lines = [header, "-" * len(header)]
    for r in rows:
        dropped = ", ".join(f"{k}={v}" for k, v in sorted(r["dropped"].items()) if v) or "-"
        lines.append(
            f"{r['stage']:<9} {r['rows_in']:>8} {r['rows_out']:>9} {r['seconds']:>7.2f}  "
            f"{'yes' if r['cached'] else 'no':<6}  {dropped}"
        )
    return "\n".join(lines)
