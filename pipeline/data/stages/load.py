"""Stage 0, load: raw text from JSONL, CSV/TSV, Parquet, a folder of .txt files or the Hub.

The file formats are parsed in pipeline/data/io/readers.py; this module locates the input, reads
the Hub, and applies the rules every format shares (`_finish`): max_rows, empty texts dropped
and counted, split names normalised, stable ids.

Output contract (pipeline/data/base.py): a `datasets.Dataset` with exactly the string columns
id, text, label ("" when unlabelled) and source_split ("" when the source has none).

Stable ids: the configured id column (checked unique), the relative file path for folders, or a
content id: the first 16 hex digits of sha1(text), with `-2`, `-3`, ... for later copies of the
same text, so adding or removing rows with other texts never changes a row's id.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from pipeline import artifacts
from pipeline.data.engines.base import StageContext, StageResult
from pipeline.data.engines.ops import TEXT, unit_hash
from pipeline.data.io import conversation, formats, pair, parts, readers
from pipeline.schema import SourceConfig

COLUMNS = ("id", TEXT, "label", "source_split")
SPLIT_ALIASES = {"valid": "validation", "val": "validation", "dev": "validation"}


# ---------------------------------------------------------------- locating the input


def resolve_path(cfg: SourceConfig) -> Path:
    """The input file or folder; `path` is relative to the installed package `cfg.package` if set."""
    if cfg.package:
        # find_spec on a top-level name locates the package without running its code
        spec = importlib.util.find_spec(cfg.package)
        if spec is None:
            raise FileNotFoundError(
                f"source.package '{cfg.package}' is not installed (needed for source.path '{cfg.path}'); "
                f"install it, e.g. `pip install {cfg.package.replace('_', '-')}`"
            )
        locations = list(spec.submodule_search_locations or [])
        root = Path(locations[0]) if locations else Path(spec.origin).parent
        path = root / cfg.path
        if not path.exists():
            raise FileNotFoundError(
                f"source.path: {path} not found in installed package '{cfg.package}' ({root}); "
                f"check source.path or reinstall the package"
            )
        return path
    path = Path(cfg.path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"source.path: {path.resolve()} not found; point source.path at an existing file or folder")
    if (kind := artifacts.special_kind(path)) is not None:  # its reader would block forever, or never end
        raise ValueError(f"source.path: {path} is {kind}, not a regular file or folder")
    return path


def fingerprint(cfg: SourceConfig) -> str:
    """Content hash of the input: a changed input file invalidates every cached stage."""
    if cfg.format == "hub":
        local = Path(cfg.path)
        content = artifacts.tree_fingerprint(local) if local.exists() else ""
        return artifacts.fingerprint("hub", cfg.path, cfg.hub_config, list(cfg.hub_splits), content)
    # the readers' code is fingerprinted by the runner with the load stage (its module list)
    path = resolve_path(cfg)
    try:
        return artifacts.tree_fingerprint(path)
    except OSError as e:
        raise ValueError(f"{e.filename or path}: cannot read: {e.strerror or e}") from None


# ---------------------------------------------------------------- the stage


def load(_: None, cfg: SourceConfig, ctx: StageContext) -> StageResult:
    """Read the source into the id/text/label/source_split contract; drops counted by reason. The
    first stage has no input (None): the shape every stage has is (input, its config section, context).
    Files and the Hub's rows are read by the engine (`read_source` here, or in parts by Ray tasks)."""
    if not cfg.text_field and cfg.format not in ("folder", "conversations") and not cfg.messages_field:
        raise ValueError("source.text_field is empty: name the column that holds the text")
    if cfg.format == "hub":  # read_hub: load_dataset here, its rows read as a part (or, on Ray, in parts)
        path, where = Path(cfg.path), f"hub dataset '{cfg.path}'"
    else:
        path = resolve_path(cfg)
        if path.is_dir() and cfg.format in ("jsonl", "csv", "tsv"):
            raise ValueError(f"source.path: {path} is a folder; source.format={cfg.format} reads one file "
                             f"(source.format=folder reads <label>/*.txt folders)")
        where = str(path)
    data, dropped, rows_read = ctx.engine.load_source(path, cfg, where, read_source)
    stats = {"format": cfg.format, "source": where, "rows_read": rows_read}
    return StageResult(data, {k: v for k, v in dropped.items() if v}, stats)


def read_source(path: Path, cfg: SourceConfig, where: str) -> tuple:
    """The local engine's load: the whole file read as one part, in this process; (Dataset, drops
    by reason, rows read). The Ray engine reads parts with the same reader and the same rules."""
    import datasets

    table, facts = formats.read_part(path, cfg, parts.WHOLE)
    (limit,), bad, rows_read = settle([facts], cfg, where)
    table, empty, unsampled = _finish(table, cfg, where, limit)
    return datasets.Dataset(table), {"bad_line": bad, "empty": empty, "not_sampled": unsampled}, rows_read


def settle(facts: list, cfg: SourceConfig, where: str) -> tuple[list[int], int, int]:
    """What the parts read (their Facts, in file order) add up to, as one read of the whole source:
    the error it would raise first (the file's bytes, then the columns pyarrow's parse found, then
    the first bad record or missing column within max_rows); (rows of each part that max_rows
    keeps, bad lines skipped, rows read)."""
    if (first := next((f.error for f in facts if f.error and f.error[0] == 0), None)) is not None:
        raise ValueError(first[2])
    read = [f for f in facts if f.rows or f.error]
    if read and all(f.parsed is not None for f in read) and parts.consistent_kinds(read):
        readers.check_columns(list(dict.fromkeys(c for f in read for c in f.parsed)), cfg, where)
    cap, prefix, bad, limits, keys = cfg.max_rows or None, 0, 0, [], {}
    for f in facts:
        def within(at):  # the record `at` records into this part is read by one whole read
            return at is None or cap is None or prefix + at < cap
        if f.error and within(f.error[1]):
            raise ValueError(f.error[2])
        bad += f.bad if f.bad_at is None else sum(map(within, f.bad_at))
        keys.update((k, None) for k, at in f.columns.items() if within(at) and k not in keys)
        limits.append(f.rows if cap is None else max(0, min(f.rows, cap - prefix)))
        prefix += f.rows
    lines = any(f.lines for f in facts)
    if lines and (prefix or keys):  # the line reader's check: the keys its records named
        readers.check_columns(list(keys), cfg, where)
    rows_read = min(prefix, cap) if lines and cap else prefix
    if not rows_read:
        raise ValueError(f"{where}: no rows to read (the input holds no records)")
    return limits, bad, rows_read


def _finish(table: pa.Table, cfg: SourceConfig, where: str, limit: int | None) -> tuple[pa.Table, int, int]:
    """Keep the first `limit` rows (max_rows), make every column a non-null string, drop empty texts,
    assign ids, sample. The Ray engine runs the same steps per part, with ids checked and numbered
    across the parts (engine_ray.py)."""
    cols, empty = finish_rows(table, cfg, where, limit)
    if "id" in cols:
        _check_ids(cols["id"], cfg, where)
    else:
        cols["id"] = pa.array(content_ids(cols[TEXT].to_pylist()), pa.string())
    table, unsampled = finish_table(cols, cfg)
    return table, empty, unsampled


def finish_rows(table: pa.Table, cfg: SourceConfig, where: str, limit: int | None) -> tuple[dict, int]:
    """The row-wise rules: the first `limit` rows, every column a non-null string (id only if the
    source has one), empty texts dropped (and counted), split names normalised."""
    if limit is not None:
        table = table.slice(0, limit)
    cols = string_columns(table, cfg, where)
    keep = nonempty(cols[TEXT])
    empty = len(keep) - pc.sum(keep).as_py() if len(keep) else 0
    cols = {name: pc.filter(col, keep) for name, col in cols.items()}
    cols["source_split"] = _normalise_splits(cols["source_split"])
    return cols, empty


def string_columns(table: pa.Table, cfg: SourceConfig, where: str) -> dict:
    """The contract's columns of a reader's rows, every one a non-null string (id only if the source has one): a
    prompt and completion or a messages column made one conversation, a sentence pair's two texts one text."""
    table = _pairs(_conversations(table, cfg, where), cfg, where)
    return {name: _as_string(table, name, where) for name in COLUMNS if name != "id" or name in table.column_names}


def nonempty(texts: pa.ChunkedArray) -> pa.ChunkedArray:
    """Which texts hold more than whitespace (the rows load keeps)."""
    return pc.not_equal(pc.utf8_trim_whitespace(texts), "")


def finish_table(cols: dict, cfg: SourceConfig) -> tuple[pa.Table, int]:
    """The contract's table of the columns, less the rows the sample leaves out; (table, rows left out)."""
    table = pa.table([cols[name] for name in COLUMNS], names=list(COLUMNS))
    rows = table.num_rows
    if cfg.sample < 1.0:  # by a hash of the id, so the sample is stable and spread over the whole file
        keep = [unit_hash(cfg.sample_seed, i) < cfg.sample for i in table.column("id").to_pylist()]
        table = table.filter(pa.array(keep, pa.bool_()))
    return table, rows - table.num_rows


def _conversations(table: pa.Table, cfg: SourceConfig, where: str) -> pa.Table:
    """Instruction data as conversation rows (pipeline/data/io/conversation.py): a prompt and its completion
    become a user and an assistant message; a messages column that a columnar reader kept as a list of
    {role, content} structs (Parquet, the hub) is encoded (the JSONL line reader encodes its own)."""
    text = table.column(TEXT) if TEXT in table.column_names else None
    if cfg.messages_field and text is not None:
        encoded = []
        for k, messages in enumerate(text.to_pylist()):
            try:
                encoded.append(_encoded(messages))
            except ValueError as e:
                raise ValueError(f"{where}: row {k + 1}, field '{cfg.messages_field}' (source.messages_field): "
                                 f"{e}") from None
        table = table.set_column(table.column_names.index(TEXT), TEXT, pa.array(encoded, pa.string()))
    if cfg.prompt_field and readers.PROMPT in table.column_names:
        prompts = _as_string(table, readers.PROMPT, where).to_pylist()
        completions = _as_string(table, TEXT, where).to_pylist()
        pairs = [conversation.encode([{"role": "user", "content": p}, {"role": "assistant", "content": c}])
                 if p.strip() and c.strip() else "" for p, c in zip(prompts, completions)]  # "": dropped as empty
        table = table.set_column(table.column_names.index(TEXT), TEXT, pa.array(pairs, pa.string()))
    return table


def _pairs(table: pa.Table, cfg: SourceConfig, where: str) -> pa.Table:
    """Sentence pairs as pair rows (pipeline/data/io/pair.py): text_field and text_pair_field made one text; a
    row with either side empty gets "" (dropped and counted as empty)."""
    if not cfg.text_pair_field or readers.PAIR not in table.column_names:
        return table
    firsts = _as_string(table, TEXT, where).to_pylist()
    seconds = _as_string(table, readers.PAIR, where).to_pylist()
    texts = [pair.encode(a, b) for a, b in zip(firsts, seconds)]
    return table.set_column(table.column_names.index(TEXT), TEXT, pa.array(texts, pa.string()))


def _encoded(messages) -> str | None:
    """A messages value as a conversation row's text: a list of {role, content} (Parquet, the hub), text the
    JSONL reader encoded already, or a JSON list in a text cell (CSV)."""
    if messages is None or (isinstance(messages, str) and conversation.is_encoded(messages)):
        return messages
    if isinstance(messages, str):
        import json

        try:
            messages = json.loads(messages)
        except json.JSONDecodeError as e:
            raise ValueError(f"not a JSON list of messages ({e.msg} at column {e.colno})") from None
        except RecursionError:
            raise ValueError("not a JSON list of messages (nested too deeply to read)") from None
    return conversation.encode(messages)


def _as_string(table: pa.Table, name: str, where: str) -> pa.ChunkedArray:
    if name not in table.column_names:
        return pa.chunked_array([pa.array([""] * table.num_rows, pa.string())])
    col = table.column(name)
    if name == "label" and (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)):  # a list per row
        return pa.chunked_array([readers.label_lists(col.to_pylist())]).fill_null("")
    try:
        col = col.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise ValueError(f"{where}: the {name} column has type {col.type}; expected text (strings)") from None
    return pc.fill_null(col, "")


def content_hashes(texts: list[str]) -> list[str]:
    """sha1(text)[:16] of each text: its content id when no other row has its text."""
    sha1 = hashlib.sha1
    return [sha1(text.encode("utf-8")).hexdigest()[:16] for text in texts]


def copy_id(content_hash: str, copy: int) -> str:
    """The id of the `copy`-th row (1, 2, ...) with this text, in the source's order."""
    return content_hash if copy == 1 else f"{content_hash}-{copy}"


def content_ids(texts: list[str]) -> list[str]:
    """sha1(text)[:16], with -2, -3, ... for later copies (keyed by hash, so ids are always unique)."""
    ids = content_hashes(texts)
    if len(set(ids)) == len(ids):
        return ids
    seen: dict[str, int] = {}
    for i, h in enumerate(ids):
        seen[h] = seen.get(h, 0) + 1
        ids[i] = copy_id(h, seen[h])
    return ids


def _check_ids(ids: pa.ChunkedArray, cfg: SourceConfig, where: str) -> None:
    if blank := blank_ids(ids):
        raise blank_ids_error(blank, cfg, where)
    counts = pc.value_counts(ids)
    dupes = pc.filter(counts, pc.greater(counts.field("counts"), 1))
    if len(dupes):
        shown = [(d["values"], d["counts"]) for d in dupes.to_pylist()[:5]]
        raise repeated_ids_error(len(dupes), shown, cfg, where)


def blank_ids(ids: pa.ChunkedArray) -> int:
    return pc.sum(pc.equal(pc.utf8_trim_whitespace(ids), "")).as_py() or 0


def blank_ids_error(blank: int, cfg: SourceConfig, where: str) -> ValueError:
    return ValueError(f"{where}: {blank} rows have an empty id in column '{cfg.id_field}' (source.id_field); "
                      f"fill them in, or set source.id_field: '' to derive ids from the text")


def repeated_ids_error(repeats: int, shown: list[tuple[str, int]], cfg: SourceConfig, where: str) -> ValueError:
    """`repeats` ids occur more than once; `shown`: the first five (id, rows), by first occurrence."""
    listed = ", ".join(f"{value!r} ({count} rows)" for value, count in shown)
    return ValueError(f"{where}: ids in column '{cfg.id_field}' (source.id_field) must be unique; "
                      f"{repeats} repeat: {listed}; fix them, or set source.id_field: '' to derive ids from the text")


def _normalise_splits(col: pa.ChunkedArray) -> pa.Array:
    """' Dev ' -> 'validation' etc., computed once per distinct value (not per row)."""
    enc = pc.dictionary_encode(col).combine_chunks()
    names = [v.strip().lower() for v in enc.dictionary.to_pylist()]
    return pa.array([SPLIT_ALIASES.get(v, v) for v in names], pa.string()).take(enc.indices)
