"""What a stage's output is, by its content: the identity of the data a run trains on.

A stage folder's name holds its fingerprint, which covers the code that made it; after an upgrade
the same bytes come back under a new name. A run records instead `content_fingerprint` of the data it
trained on: each split's features and rows, and the bytes of the stage's side folders (the
tokenizer), so data rebuilt by other code, or by another engine in other shards, is the same data.

Rows are hashed column by column from the Arrow buffers, in row order, independent of how the rows
are cut into files, record batches or chunks (`column_digest`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pipeline import artifacts

DATA = "data"  # a stage folder's Dataset / DatasetDict (the runner's layout)
NOT_CONTENT = (artifacts.MANIFEST,)  # what a folder says about itself, not what it holds


def column_digest(chunks: list) -> bytes:
    """One column's values in row order, as bytes that do not depend on where its chunks are cut: the
    value lengths, the bytes (strings) or flattened values (lists, recursively) and the null count,
    each hashed across all chunks."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    lengths, values, nulls, children = hashlib.sha256(), hashlib.sha256(), 0, []
    for arr in chunks:
        t, nulls = arr.type, nulls + arr.null_count
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
            lengths.update(pc.binary_length(arr).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64).tobytes())
            offsets, data = arr.buffers()[1], arr.buffers()[2]
            width = 8 if pa.types.is_large_string(t) or pa.types.is_large_binary(t) else 4
            if len(arr) and data is not None:
                first, last = np.frombuffer(offsets, dtype=f"<i{width}")[[arr.offset, arr.offset + len(arr)]]
                values.update(memoryview(data)[first:last])
        elif pa.types.is_list(t) or pa.types.is_large_list(t):
            lengths.update(pc.list_value_length(arr).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64).tobytes())
            children.append(pc.list_flatten(arr))
        else:
            values.update(arr.fill_null(0).to_numpy(zero_copy_only=False).tobytes())
    child = column_digest(children) if children else b""
    return hashlib.sha256(lengths.digest() + values.digest() + child + str(nulls).encode()).digest()


def dataset_digest(ds, h: "hashlib._Hash") -> None:
    """A Dataset's features and rows into `h` (its selected rows where it has an indices mapping)."""
    h.update(json.dumps(ds.features.to_dict(), sort_keys=True).encode())
    table = ds.flatten_indices().data.table if ds._indices is not None else ds.data.table
    for name in table.column_names:
        h.update(b"\0column\0" + name.encode())
        h.update(column_digest(table.column(name).chunks))


def content_fingerprint(stage_dir: str | Path, data=None) -> str:
    """Of a complete stage folder (or one being written): its data's features and rows, split by split,
    and every other file's name and bytes (data/'s own files aside: datasets' bookkeeping is not
    content; hidden ones aside: scratch). `data`: the folder's data as already loaded by the caller."""
    import datasets

    stage_dir = Path(stage_dir)
    h = hashlib.sha256()
    data = datasets.load_from_disk(str(stage_dir / DATA)) if data is None else data
    named = {"": data} if isinstance(data, datasets.Dataset) else dict(data)
    for split in sorted(named):
        h.update(b"\0split\0" + split.encode())
        dataset_digest(named[split], h)
    for p in sorted(q for q in stage_dir.rglob("*") if q.is_file()):
        rel = p.relative_to(stage_dir)
        scratch = any(part.startswith(".") for part in rel.parts)  # an engine's temporaries (Ray's .ray-maps)
        if rel.parts[0] != DATA and rel.name not in NOT_CONTENT and not scratch:
            h.update(b"\0file\0" + str(rel).encode() + artifacts.file_sha256(p).encode())
    return h.hexdigest()[:16]
