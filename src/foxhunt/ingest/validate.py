"""Record-level validation rules, vectorised over a chunk of records.

Each rule returns a boolean mask of the records that break it. State that spans chunks (the last
ts_event and the last record per instrument) lives in `StreamState`, so a file is checked the
same whichever chunk size reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from foxhunt.dbn.layout import UNDEF_PRICE, SchemaLayout, levels_view

RULE_RTYPE = "record type does not belong to the file's schema"
RULE_LENGTH = "record length field does not match the schema's record size"
RULE_ORDER = "ts_event goes backwards for this instrument"
RULE_PRICE = "non-positive price"
RULE_CROSSED = "crossed book: best bid >= best ask"
RULE_DUPLICATE = "duplicate record"

# Actions whose `price` must be a real price (R = clear book and N = none may carry UNDEF).
_PRICED_ACTIONS = np.array([b"A", b"C", b"M", b"T", b"F"], dtype="S1")


@dataclass
class StreamState:
    last_ts: dict[int, int] = field(default_factory=dict)
    last_rec: dict[int, bytes] = field(default_factory=dict)


def check_chunk(
    recs: np.ndarray, layout: SchemaLayout, state: StreamState
) -> list[tuple[str, np.ndarray]]:
    """[(rule, mask)] for every rule some record of this chunk breaks."""
    out: list[tuple[str, np.ndarray]] = []

    def add(rule: str, mask: np.ndarray) -> None:
        if mask.any():
            out.append((rule, mask))

    add(RULE_RTYPE, ~np.isin(recs["rtype"], layout.rtypes))
    add(RULE_LENGTH, recs["length"].astype(np.int64) * 4 != recs.dtype.itemsize)

    names = recs.dtype.names
    bad_px = np.zeros(len(recs), dtype=bool)
    for f in layout.price_fields:
        bad_px |= recs[f] <= 0
    if layout.name == "trades":
        bad_px |= recs["price"] == UNDEF_PRICE
    if "bid_px_00" in names:  # MBP-10: the event price and every occupied level
        priced = np.isin(recs["action"], _PRICED_ACTIONS)
        bad_px |= priced & ((recs["price"] <= 0) | (recs["price"] == UNDEF_PRICE))
        lv = levels_view(recs)
        for side in ("bid", "ask"):
            px, sz = lv[f"{side}_px"], lv[f"{side}_sz"]
            bad_px |= ((sz > 0) & ((px <= 0) | (px == UNDEF_PRICE))).any(axis=1)
        both = (recs["bid_sz_00"] > 0) & (recs["ask_sz_00"] > 0)
        add(RULE_CROSSED, both & (recs["bid_px_00"] >= recs["ask_px_00"]))
    add(RULE_PRICE, bad_px)

    order_bad, dup = _order_and_duplicates(recs, layout, state)
    add(RULE_ORDER, order_bad)
    add(RULE_DUPLICATE, dup)
    return out


def _order_and_duplicates(
    recs: np.ndarray, layout: SchemaLayout, state: StreamState
) -> tuple[np.ndarray, np.ndarray]:
    n = len(recs)
    order_bad = np.zeros(n, dtype=bool)
    dup = np.zeros(n, dtype=bool)
    if n == 0:
        return order_bad, dup
    iid = recs["instrument_id"]
    ts = recs["ts_event"].astype(np.int64)
    # Whole records compare as raw bytes; bars and definitions repeat when (id, ts_event) does.
    bar_like = layout.name.startswith("ohlcv") or layout.name == "definition"
    raw = recs.view(np.dtype((np.void, recs.dtype.itemsize)))
    perm = np.argsort(iid, kind="stable")  # per instrument, file order kept
    s_iid, s_ts, s_raw = iid[perm], ts[perm], raw[perm]
    first = np.concatenate([[True], s_iid[1:] != s_iid[:-1]])
    prev_ts = np.concatenate([[0], s_ts[:-1]])
    prev_raw = np.concatenate([s_raw[:1], s_raw[:-1]])
    # The first record of each instrument compares with the previous chunk's last one.
    firsts = np.flatnonzero(first)
    has_prev = np.zeros(n, dtype=bool)
    has_prev[~first] = True
    for j in firsts:
        k = int(s_iid[j])
        if k in state.last_ts:
            prev_ts[j] = state.last_ts[k]
            prev_raw[j] = np.frombuffer(state.last_rec[k], dtype=raw.dtype)[0]
            has_prev[j] = True
    s_order = has_prev & (s_ts < prev_ts)
    if bar_like:
        s_dup = has_prev & (s_ts == prev_ts)
    else:
        s_dup = has_prev & (s_raw == prev_raw)
    order_bad[perm] = s_order
    dup[perm] = s_dup
    lasts = np.append(firsts[1:], n) - 1
    for j in lasts:
        k = int(s_iid[j])
        state.last_ts[k] = int(s_ts[j])
        state.last_rec[k] = s_raw[j].tobytes()
    return order_bad, dup
