"""DBN record arrays -> Arrow tables, keeping prices as exact fixed-point int64."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from foxhunt.dbn.columns import RecordColumns

# u64 nanosecond fields that are timestamps (ts_in_delta is a signed duration, not one).
TIMESTAMP_FIELDS = {"ts_event", "ts_recv", "ts_out", "expiration", "activation"}
UNDEF_TIMESTAMP = np.iinfo(np.uint64).max
TS_TYPE = pa.timestamp("ns", tz="UTC")

# Columns a definition record keeps: enough to know what an instrument is.
DEFINITION_FIELDS = (
    "ts_recv",
    "ts_event",
    "rtype",
    "publisher_id",
    "instrument_id",
    "raw_symbol",
    "asset",
    "security_type",
    "instrument_class",
    "exchange",
    "currency",
    "min_price_increment",
    "display_factor",
    "unit_of_measure_qty",
    "expiration",
    "activation",
    "security_update_action",
)


def _column(name: str, col: np.ndarray) -> pa.Array:
    if name in TIMESTAMP_FIELDS:
        raw = np.ascontiguousarray(col)
        mask = raw == UNDEF_TIMESTAMP
        if mask.any():
            arr = pa.array(raw.view(np.int64), type=pa.int64(), mask=mask)
            return arr.cast(TS_TYPE)
        return pa.Array.from_buffers(TS_TYPE, len(raw), [None, pa.py_buffer(raw)])
    if col.dtype.kind == "S":
        width = col.dtype.itemsize
        raw = np.ascontiguousarray(col).view(np.uint8)
        if width == 1 and not (raw >= 0x80).any():
            # One ASCII character (action, side, ...): the bytes are the string data as they
            # are, and the offsets just count 0, 1, 2, ... (A byte >= 0x80 is not UTF-8 on its
            # own: such a column, seen only among quarantined records, takes the path below.)
            offsets = pa.py_buffer(np.arange(len(col) + 1, dtype=np.int32))
            return pa.Array.from_buffers(pa.string(), len(col), [None, offsets, pa.py_buffer(raw)])
        # NUL-padded C strings (symbols): decoded per value, only for definition records; bytes
        # that are not ASCII become U+FFFD, so the column is always valid UTF-8.
        return pa.array([v.decode("ascii", "replace") for v in col.tolist()], type=pa.string())
    # Zero-copy over the column's buffer (pa.array would do the same, but its first call in a
    # process imports pandas: ~0.3 s per ingest worker).
    raw = np.ascontiguousarray(col)
    if raw.dtype.kind not in "iuf":
        return pa.array(raw)
    return pa.Array.from_buffers(
        pa.from_numpy_dtype(raw.dtype), len(raw), [None, pa.py_buffer(raw)]
    )


def to_table(recs: np.ndarray | RecordColumns, schema: str) -> pa.Table:
    cols = recs if isinstance(recs, RecordColumns) else RecordColumns(recs)
    names = cols.dtype.names
    if schema == "definition":
        names = tuple(n for n in DEFINITION_FIELDS if n in names)
    else:
        names = tuple(n for n in names if n != "length" and not n.startswith("_"))
    # Databento's own frames lead with the index timestamp; so does ours.
    if "ts_recv" in names:
        names = ("ts_recv", *[n for n in names if n != "ts_recv"])
    arrays = [_column(n, cols[n]) for n in names]
    fields = [
        pa.field(n, a.type, nullable=a.null_count > 0) for n, a in zip(names, arrays, strict=True)
    ]
    return pa.Table.from_arrays(arrays, schema=pa.schema(fields))
