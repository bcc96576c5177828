"""Rows and Arrow tables of the work directory's parts: rows checked against a table's schema
and made into Arrow tables (`validate_rows`, `table_of_rows`, `conform_table`), their sizes,
the Parquet options a part is written with (`writer_options`), and rows read back out of row
groups, binary columns as views of Arrow's buffers (`binary_views`)."""

from __future__ import annotations

import functools
import io
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def validate_rows(rows: Iterable[Mapping[str, Any]], schema: pa.Schema) -> list[Mapping[str, Any]]:
    """Check rows against a schema: no unknown columns, no missing required values."""
    names = set(schema.names)
    required = [f.name for f in schema if not f.nullable]
    out = []
    for row in rows:
        extra = row.keys() - names
        if extra:
            raise ValueError(f"unknown columns {sorted(extra)} for schema with {schema.names}")
        missing = [n for n in required if row.get(n) is None]
        if missing:
            raise ValueError(f"missing required columns {missing} in row {_short(row)}")
        out.append(row)
    return out


def row_bytes(row: Mapping[str, Any]) -> int:
    """Bytes of a row's str and bytes values (a memoryview counts as bytes): what buffer limits count."""
    return sum(v.nbytes if type(v) is memoryview else len(v) for v in row.values()
               if isinstance(v, (bytes, str, memoryview)))


def _short(row: Mapping[str, Any]) -> str:
    return "{" + ", ".join(f"{k}={str(v)[:60]!r}" for k, v in row.items()) + "}"


def table_of_rows(rows: list[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """`pa.Table.from_pylist(rows, schema=schema)`, with binary columns built in one piece.

    Arrow's builder grows a binary column by doubling, copying the media bytes of a row group
    (8 MiB) several times into freshly mapped memory; here each binary column is one
    `b"".join` of its values wrapped as the array's data buffer, which is the same array.
    Binary values may also be memoryviews (`WorkDir.iter_rows(views=True)`)."""
    columns = [_binary_array([row.get(f.name) for row in rows]) if f.type == pa.binary() else None
               for f in schema]
    if all(c is None for c in columns):
        return pa.Table.from_pylist(rows, schema=schema)
    arrays = [c if c is not None else pa.array([row.get(f.name) for row in rows], type=f.type)
              for f, c in zip(schema, columns)]
    return pa.Table.from_arrays(arrays, schema=schema)


def conform_table(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """`table` with exactly `schema`'s columns, in its order and types (a missing column is
    null); a ValueError for an unknown column, a null in a required one or a failed cast, as
    `validate_rows` and the row path give."""
    extra = set(table.column_names) - set(schema.names)
    if extra:
        raise ValueError(f"unknown columns {sorted(extra)} for schema with {schema.names}")
    columns = []
    for f in schema:
        if f.name not in table.column_names:
            col = pa.nulls(table.num_rows, f.type)
        else:
            col = table.column(f.name)
            if col.type != f.type:
                try:
                    col = col.cast(f.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                    raise ValueError(f"column {f.name}: {exc}") from exc
        if not f.nullable and col.null_count:
            raise ValueError(f"missing required columns [{f.name!r}] in {col.null_count} rows")
        columns.append(col)
    return pa.Table.from_arrays(columns, schema=schema)


def table_row_bytes(table: pa.Table) -> np.ndarray:
    """`row_bytes` of every row of a table, as it counts them: characters of its top-level
    strings, bytes of its top-level binaries."""
    total = np.zeros(table.num_rows, np.int64)
    for col in table.columns:
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            total += pc.fill_null(pc.utf8_length(col), 0).to_numpy()
        elif pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
            total += pc.fill_null(pc.binary_length(col), 0).to_numpy()
    return total


def _binary_array(values: list[Any]) -> pa.Array | None:
    """A binary array of bytes/memoryview/None values built from one joined buffer, or None
    when the values are anything else (Arrow's own conversion handles those, and its errors)."""
    if not all(v is None or type(v) is bytes or type(v) is memoryview for v in values):
        return None
    present = [v for v in values if v is not None]
    data = b"".join(present)
    if len(data) > 2**31 - 1:  # 32-bit offsets: Arrow's conversion says what to do
        return None
    offsets = np.zeros(len(values) + 1, np.int32)
    np.cumsum([0 if v is None else v.nbytes if type(v) is memoryview else len(v) for v in values],
              out=offsets[1:])
    nulls = len(values) - len(present)
    validity = None
    if nulls:
        validity = pa.py_buffer(np.packbits(np.array([v is not None for v in values]), bitorder="little"))
    return pa.Array.from_buffers(pa.binary(), len(values), [validity, pa.py_buffer(offsets), pa.py_buffer(data)],
                                 null_count=nulls)


# Columns that hold already-compressed media (JPEG, PNG, WebP bytes): zstd cannot shrink them
# and would cost time on every write and read, so they are stored as they are.
INCOMPRESSIBLE_COLUMNS = frozenset({"bytes"})


@functools.lru_cache(maxsize=64)
def compression_of(schema: pa.Schema) -> dict[str, str]:
    """Per-column Parquet codecs: zstd everywhere but the media columns."""
    buf = io.BytesIO()
    pq.ParquetWriter(buf, schema).close()  # the leaf column paths, as Parquet names them
    paths = [c.path for c in pq.ParquetFile(io.BytesIO(buf.getvalue())).schema]
    return {p: "none" if p.split(".")[0] in INCOMPRESSIBLE_COLUMNS else "zstd" for p in paths}


def writer_options(schema: pa.Schema) -> dict[str, Any]:
    """The `pq.ParquetWriter` options of every part: zstd, dictionaries and min/max statistics,
    but none of the three on media bytes (all wasted on JPEGs)."""
    codecs = compression_of(schema)
    plain = [c for c, codec in codecs.items() if codec != "none"]
    return {"compression": codecs, "use_dictionary": plain, "write_statistics": plain,
            "write_page_checksum": True}  # every reader verifies them (`storage.CheckedParquetFile`)


def _rows_with_views(batch: pa.RecordBatch) -> list[dict[str, Any]]:
    """`batch.to_pylist()`, but binary columns as memoryviews into the batch's buffers."""
    columns = [binary_views(col) if col.type == pa.binary() else col.to_pylist() for col in batch.columns]
    names = batch.schema.names
    return [dict(zip(names, values)) for values in zip(*columns)] if columns else [{} for _ in range(batch.num_rows)]


def _rows_of(group: pa.Table, batch_size: int, views: bool) -> Iterator[dict[str, Any]]:
    for batch in group.to_batches(max_chunksize=batch_size):
        yield from (_rows_with_views(batch) if views else batch.to_pylist())


def binary_views(array: pa.Array) -> list[memoryview | None]:
    """The values of a binary array as read-only memoryviews into its data buffer (None for a
    null): no copy, and none of the cost of an Arrow scalar per value."""
    _, offsets, data = array.buffers()
    ends = np.frombuffer(offsets, np.int32, count=len(array) + 1, offset=4 * array.offset).tolist()
    view = memoryview(data if data is not None else b"").cast("B").toreadonly()
    valid = array.is_valid().to_pylist() if array.null_count else None
    return [view[ends[i]:ends[i + 1]] if valid is None or valid[i] else None for i in range(len(array))]
