"""The Hugging Face Hub as a source: load_dataset (the download, on the driver), and a split's rows
read from its cache files, whole or in ranges (a Ray task's part)."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.data.io import readers
from pipeline.data.io.parts import WHOLE, Facts, Part
from pipeline.schema import SourceConfig

HUB_CHECK_TIMEOUT_S = 3.0  # connectivity check before load_dataset, so offline never hangs


def hub_offline() -> bool:
    import huggingface_hub.constants as hf

    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("HF_DATASETS_OFFLINE", ""))
    return bool(hf.HF_HUB_OFFLINE) or any(v.strip().lower() in ("1", "true", "yes", "on") for v in flags)


def reachable(url: str, timeout: float = HUB_CHECK_TIMEOUT_S) -> bool:
    """Can a TCP connection to the URL's host be opened within `timeout` s (DNS included)?"""
    parsed = urlparse(url)
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((parsed.hostname, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    thread = threading.Thread(target=probe, daemon=True)  # daemon: a hung DNS lookup cannot block exit
    thread.start()
    thread.join(timeout)
    return bool(ok)


def read_hub(cfg: SourceConfig, part: Part = WHOLE) -> tuple[pa.Table, Facts]:
    """The reader of format hub (formats.read_part): every split, loaded here, or the rows of one
    split's range, from its cache files (a Ray task's part: hub_parts), as strings."""
    import pickle

    if part.rows is None:
        table = pa.concat_tables([_hub_table(ds, split, cfg) for split, ds in load_hub(cfg).items()])
    else:
        split, _, blob, start, end = part.rows
        table = _hub_table(pickle.loads(blob), split, cfg, start, end)  # memory-maps the split's files
    return table, Facts(rows=table.num_rows)


def load_hub(cfg: SourceConfig) -> dict:
    """split -> Dataset: datasets.load_dataset, which downloads and prepares the splits' Arrow files in
    the HF datasets cache (HF_DATASETS_CACHE) and memory-maps them."""
    import datasets
    import huggingface_hub.constants as hf

    local = Path(cfg.path).exists()
    if not local and not hub_offline() and not reachable(hf.ENDPOINT):
        raise ValueError(
            f"hub dataset '{cfg.path}': cannot reach {hf.ENDPOINT} within {HUB_CHECK_TIMEOUT_S:g} s; "
            f"offline, set HF_HUB_OFFLINE=1 to use a cached copy, or point source.format/path at local files"
        )
    splits = list(cfg.hub_splits)
    try:
        loaded = datasets.load_dataset(cfg.path, cfg.hub_config or None, split=splits or None)
    except Exception as e:  # noqa: BLE001 - any failure here is the user's to fix; say what and where
        mode = " with HF_HUB_OFFLINE=1 (is it in the local cache?)" if hub_offline() else ""
        raise ValueError(f"hub dataset '{cfg.path}' (config '{cfg.hub_config}', splits {splits or 'all'}) "
                         f"could not be loaded{mode}: {type(e).__name__}: {e}") from None
    return dict(zip(splits, loaded)) if splits else dict(loaded)


def _hub_table(ds, split: str, cfg: SourceConfig, start: int = 0, end: int | None = None) -> pa.Table:
    """Rows start:end of one split as strings; a ClassLabel column becomes its class names (-1,
    unlabelled, becomes ""); a list of labels (GoEmotions' Sequence(ClassLabel), or of strings) becomes its
    names as one text (readers.label_list)."""
    import datasets

    where = f"hub dataset '{cfg.path}' split '{split}'"
    needed = readers.check_columns(ds.column_names, cfg, where)
    table = readers.select(ds.with_format("arrow")[start:end], needed)
    feature = ds.features.get(cfg.label_field)
    if cfg.label_field and isinstance(feature, datasets.ClassLabel):
        codes = table.column("label")
        names = pa.array([*feature.names, ""], pa.string())
        table = table.set_column(table.column_names.index("label"), "label",
                                 names.take(pc.if_else(pc.less(codes, 0), len(feature.names), codes)))
    elif cfg.label_field and hasattr(feature, "feature"):  # Sequence / List of labels
        inner = feature.feature
        named = (lambda v: [inner.names[c] for c in v if c >= 0]) if isinstance(inner, datasets.ClassLabel) else list
        values = [None if v is None else named(v) for v in table.column("label").to_pylist()]
        table = table.set_column(table.column_names.index("label"), "label", readers.label_lists(values))
    if not cfg.split_field:
        table = table.append_column("source_split", pa.array([split] * table.num_rows, pa.string()))
    try:
        return table.cast(pa.schema([(n, pa.string()) for n in table.column_names]))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        raise ValueError(f"{where}: columns {needed} must hold text; types: {table.schema}") from None


def hub_parts(cfg: SourceConfig, n: int) -> list[Part]:
    """Each split's rows in ranges (about n in all, one at least per split), read by tasks from the
    split's cache files; [WHOLE] when a split is not memory-mapped (module docstring)."""
    import pickle

    named = load_hub(cfg)  # the download: load_dataset writes the Arrow files, on the driver
    if not all(_memory_mapped(ds) for ds in named.values()):
        return [WHOLE]
    total, out = sum(ds.num_rows for ds in named.values()) or 1, []
    for split, ds in named.items():
        files, blob = tuple(f["filename"] for f in ds.cache_files), pickle.dumps(ds)  # file names and slices
        k = max(1, min(ds.num_rows, round(n * ds.num_rows / total)))
        bounds = [ds.num_rows * j // k for j in range(k + 1)]
        out += [Part(rows=(split, files, blob, a, b)) for a, b in zip(bounds[:-1], bounds[1:])]
    return out


def _memory_mapped(ds) -> bool:
    """Is every block of the split's table mapped from a cache file, with no indices mapping (so that
    pickled it is file names and slices, not rows)?"""
    from datasets.table import ConcatenationTable, MemoryMappedTable

    table = ds.data
    blocks = [b for row in table.blocks for b in row] if isinstance(table, ConcatenationTable) else [table]
    return ds._indices is None and bool(ds.cache_files) and all(isinstance(b, MemoryMappedTable) for b in blocks)


