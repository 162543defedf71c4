"""The prepare runner: the stage table, fingerprint-keyed caching, manifests and the report.

Stage k's directory is `<data_dir>/stages/<k>-<name>-<fingerprint>`, where the fingerprint covers
the stage's config sections, the source of its code and the fingerprint of its input. A complete
directory (manifest present) is reused without loading anything; the first stage whose directory
is missing (or forced) and every stage after it run again.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from pipeline import artifacts
from pipeline.config import Config, pretrained_tokenizer_name
from pipeline.data.common import StageContext, StageResult, num_rows

PREPARED = "prepared.json"
STAGE_NAMES = ("load", "clean", "dedup", "split", "label", "tokenize")
SECTION_OF = {"load": "source"}  # the config section of a stage not named after it


@dataclass
class Stage:
    name: str
    run: Callable[[Any, StageContext], StageResult]
    config: tuple  # the config sections (or values) this stage's output depends on
    modules: tuple  # names of the modules under pipeline.data whose source defines this stage


def _call(module: str, function: str, *args: Any) -> StageResult:
    """Import a stage module only when the stage runs: a fully cached prepare imports no datasets."""
    return getattr(importlib.import_module(f"pipeline.data.{module}"), function)(*args)


def stage_table(cfg: Config) -> list[Stage]:
    """The pipeline, in order. Reads like a table of contents."""
    tok = (cfg.tokenize, pretrained_tokenizer_name(cfg) if cfg.tokenize.kind == "pretrained" else "")
    return [
        Stage("load", lambda _, ctx: _call("sources", "load", cfg.source, ctx), (cfg.source,), ("sources", "readers")),
        Stage("clean", lambda d, ctx: _call("clean", "clean", d, cfg.clean, ctx), (cfg.clean,), ("clean",)),
        Stage("dedup", lambda d, ctx: _call("dedup", "dedup", d, cfg.dedup, ctx), (cfg.dedup,), ("dedup", "minhash", "shingling")),
        Stage("split", lambda d, ctx: _call("split", "split", d, cfg.split, cfg.dedup, ctx), (cfg.split, cfg.dedup),
              ("split", "minhash", "shingling")),
        Stage("label", lambda d, ctx: _call("label", "label", d, cfg.label, ctx), (cfg.label,), ("label",)),
        Stage("tokenize", lambda d, ctx: _call("encode", "encode", d, cfg.tokenize, tok[1], ctx), tok, ("encode",)),
    ]


def _code_fingerprint(modules: tuple) -> str:
    """Hash of the stage modules' source files, read without importing them."""
    paths = [importlib.util.find_spec(f"pipeline.data.{m}").origin for m in modules]
    return artifacts.fingerprint([Path(p).read_bytes().decode("utf-8") for p in paths])


def data_config_fingerprint(cfg: Config) -> str:
    """Fingerprint of every setting that shapes the prepared data (not the source bytes)."""
    tok = pretrained_tokenizer_name(cfg) if cfg.tokenize.kind == "pretrained" else ""
    return artifacts.fingerprint(
        _config_dicts((cfg.source, cfg.clean, cfg.dedup, cfg.split, cfg.label, cfg.tokenize)), tok
    )


NOT_IN_FINGERPRINT = ("num_proc",)  # how a stage runs, not what it produces (same output, tested)


def _config_dicts(values: tuple) -> list:
    """The config sections as dicts, less the fields that cannot change a stage's output."""
    out = []
    for v in values:
        d = asdict(v) if hasattr(v, "__dataclass_fields__") else v
        out.append({k: x for k, x in d.items() if k not in NOT_IN_FINGERPRINT} if isinstance(d, dict) else d)
    return out


def run(cfg: Config, force: bool = False, from_stage: str | None = None, progress: bool = True) -> list[dict]:
    """Run (or reuse) every stage; return one report row per stage."""
    from pipeline.data import sources

    if from_stage is not None and from_stage not in STAGE_NAMES:
        raise ValueError(f"--from {from_stage!r} is not a stage; stages: {', '.join(STAGE_NAMES)}")
    first_forced = 0 if force else (STAGE_NAMES.index(from_stage) if from_stage else len(STAGE_NAMES))
    stages_root = cfg.data_dir / "stages"
    for folder in (stages_root, cfg.data_dir):  # stage folders; prepared.json and report.json
        artifacts.remove_stale_temporaries(folder)
    _check_output_outside_input(cfg)
    input_fp = sources.fingerprint(cfg.source)
    if cfg.tokenize.kind == "pretrained":  # a mistyped tokenizer path fails now, not after five stages
        from pipeline.data.encode import local_tokenizer

        local_tokenizer(pretrained_tokenizer_name(cfg))
    data, data_dir, rows, manifests = None, None, [], {}
    for k, stage in enumerate(stage_table(cfg)):
        fp = artifacts.fingerprint(stage.name, _code_fingerprint(stage.modules), _config_dicts(stage.config), input_fp)
        out = stages_root / f"{k}-{stage.name}-{fp}"
        t0 = time.perf_counter()
        # a forced stage is replaced when its new copy is complete, never deleted first: a kill
        # in the middle of rmtree could leave its manifest next to half of its data
        man = _cached_manifest(out) if k < first_forced else None
        if man is not None:
            rows.append({**_row(man), "cached": True, "seconds": round(time.perf_counter() - t0, 3)})
            data = None  # loaded lazily, only if a later stage must run
        else:
            if data is None and data_dir is not None:
                data = load_stage(data_dir, STAGE_NAMES[k - 1])
            data, man = _run_stage(stage, data, out, fp, input_fp, cfg, progress)
            rows.append({**_row(man), "cached": False})
        input_fp, data_dir, manifests[stage.name] = fp, out, man
    artifacts.write_json_atomic(
        cfg.data_dir / PREPARED,
        {
            "stage_dir": str(data_dir.resolve()),
            "fingerprint": input_fp,
            "config_fingerprint": data_config_fingerprint(cfg),
            "label_names": manifests["label"]["stats"]["label_names"],
        },
    )
    artifacts.write_json_atomic(cfg.data_dir / "report.json", rows)
    return rows


def _check_output_outside_input(cfg: Config) -> None:
    """Stages written inside a source folder would change its fingerprint (and its classes) every run."""
    from pipeline.data import sources

    if cfg.source.format == "hub" and not Path(cfg.source.path).exists():
        return
    src = sources.resolve_path(cfg.source).resolve()
    if src.is_dir() and cfg.data_dir.resolve().is_relative_to(src):
        raise ValueError(f"output_dir {cfg.output_dir} is inside source.path {src}: each run would change the input "
                         f"it reads; put output_dir outside it")


def _cached_manifest(out: Path) -> dict | None:
    """The manifest of a complete stage; one damaged on disk makes the stage run again."""
    if not artifacts.is_complete(out):
        return None
    try:
        return artifacts.read_json(out / artifacts.MANIFEST)
    except ValueError as e:
        print(f"warning: {e}; running the stage again", file=sys.stderr)
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


def _save(data: Any, folder: Path) -> None:
    """save_to_disk, with one shard for each empty dataset: datasets writes zero shards for one,
    and load_from_disk then fails (IndexError) on the folder it wrote itself."""
    if hasattr(data, "num_rows") and isinstance(data.num_rows, int):
        data.save_to_disk(str(folder), num_shards=1 if data.num_rows == 0 else None)
    else:
        data.save_to_disk(str(folder), num_shards={k: 1 for k, d in data.items() if d.num_rows == 0})


def _run_stage(stage: Stage, data: Any, out: Path, fp: str, input_fp: str, cfg: Config, progress: bool):
    import datasets

    datasets.disable_caching()  # stages cache themselves; no cache-*.arrow files inside earlier stages' dirs
    start = time.perf_counter()
    rows_in = num_rows(data) if data is not None else None
    with artifacts.atomic_dir(out, replace=True) as tmp:
        ctx = StageContext(out_dir=tmp, num_proc=max(cfg.dedup.num_proc, cfg.tokenize.num_proc), progress=progress)
        result = stage.run(data, ctx)
        if num_rows(result.data) == 0:
            section = SECTION_OF.get(stage.name, stage.name)
            raise ValueError(
                f"stage '{stage.name}' left no rows (dropped: {result.dropped or 'none'}); "
                f"loosen its settings in the config's `{section}` section ({section}.*)"
            )
        _save(result.data, tmp / "data")
        _check_readable(_load(tmp), stage.name)  # a stage that cannot be read back is never marked complete
        man = artifacts.manifest(
            stage=stage.name,
            fingerprint=fp,
            input_fingerprint=input_fp,
            rows_in=rows_in if rows_in is not None else num_rows(result.data) + sum(result.dropped.values()),
            rows_out=num_rows(result.data),
            dropped=result.dropped,
            seconds=round(time.perf_counter() - start, 3),
            stats=result.stats,
            config=_config_dicts(stage.config),
        )
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
