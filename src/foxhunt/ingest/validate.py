"""Record-level validation rules, vectorised over a chunk of records.

Each rule returns a boolean mask of the records that break it. State that spans chunks (the last
ts_event and the last record per instrument) lives in `StreamState`, so a file is checked the
same whichever chunk size reads it.

Order has two modes. Failing on the first bad record, the record whose ts_event is below its
predecessor's is named. Setting bad records aside (quarantine), the records dropped are the
fewest that leave each instrument's ts_event non-decreasing (the complement of a longest
non-decreasing subsequence), so a record displaced far into the future is the one set aside,
not the run of valid records after it. The next chunk is looked at for that decision, so a
displaced record at the end of a chunk is judged like any other.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

import numpy as np

from foxhunt.dbn.columns import RecordColumns
from foxhunt.dbn.layout import LEVELS, UNDEF_PRICE, SchemaLayout

RULE_RTYPE = "record type does not belong to the file's schema"
RULE_LENGTH = "record length field does not match the schema's record size"
RULE_ORDER = "ts_event goes backwards for this instrument"
RULE_PRICE = "non-positive price"
RULE_CROSSED = "crossed book: best bid >= best ask"
RULE_DUPLICATE = "duplicate record"
RULE_ACTION = "unknown action (not one of A C M R T F N)"
RULE_SIDE = "unknown side (not one of A B N)"
# A record of another type or size means the fixed-size framing is lost: no record after it can
# be trusted, so the file cannot be decoded as its schema.
FRAMING_RULES = (RULE_RTYPE, RULE_LENGTH)

_ACTIONS = np.zeros(256, dtype=bool)
_ACTIONS[[ord(a) for a in "ACMRTFN"]] = True
_SIDES = np.zeros(256, dtype=bool)
_SIDES[[ord(a) for a in "ABN"]] = True

# Actions whose `price` must be a real price (R = clear book and N = none may carry UNDEF), as
# a lookup table over the action byte.
_PRICED = np.zeros(256, dtype=bool)
_PRICED[[ord(a) for a in "ACMTF"]] = True


@dataclass
class StreamState:
    last_ts: dict[int, int] = field(default_factory=dict)
    last_key: dict[int, np.ndarray] = field(default_factory=dict)


def check_chunk(
    recs: np.ndarray | RecordColumns,
    layout: SchemaLayout,
    state: StreamState,
    exact: bool = False,
    after: RecordColumns | None = None,
) -> list[tuple[str, np.ndarray]]:
    """[(rule, mask)] for every rule some record of this chunk breaks. With `exact` (records
    are set aside, not failed on), out-of-order records are the fewest that restore the order,
    judged with `after` (the next chunk, None at the end of the file) in view."""
    cols = recs if isinstance(recs, RecordColumns) else RecordColumns(recs)
    recs = cols
    out: list[tuple[str, np.ndarray]] = []

    def add(rule: str, mask: np.ndarray) -> None:
        if mask.any():
            out.append((rule, mask))

    rtype = recs["rtype"]
    add(
        RULE_RTYPE,
        rtype != layout.rtypes[0] if len(layout.rtypes) == 1 else ~np.isin(rtype, layout.rtypes),
    )
    add(RULE_LENGTH, recs["length"].astype(np.int64) * 4 != cols.dtype.itemsize)

    names = cols.dtype.names
    if "action" in names:  # one ASCII letter each; anything else is not a DBN event
        add(RULE_ACTION, ~_ACTIONS[recs["action"].view(np.uint8)])
    if "side" in names:
        add(RULE_SIDE, ~_SIDES[recs["side"].view(np.uint8)])
    bad_px = np.zeros(len(recs), dtype=bool)
    for f in layout.price_fields:
        bad_px |= recs[f] <= 0
    if layout.name == "trades":
        bad_px |= recs["price"] == UNDEF_PRICE
    if "bid_px_00" in names:  # MBP-10: the event price and every occupied level
        priced = _PRICED[recs["action"].view(np.uint8)]
        bad_px |= priced & ((recs["price"] <= 0) | (recs["price"] == UNDEF_PRICE))
        for i in range(LEVELS):
            for side in ("bid", "ask"):
                px, sz = cols[f"{side}_px_{i:02d}"], cols[f"{side}_sz_{i:02d}"]
                bad_px |= (sz > 0) & ((px <= 0) | (px == UNDEF_PRICE))
        both = (recs["bid_sz_00"] > 0) & (recs["ask_sz_00"] > 0)
        add(RULE_CROSSED, both & (recs["bid_px_00"] >= recs["ask_px_00"]))
    add(RULE_PRICE, bad_px)

    order_bad, dup = _order_and_duplicates(cols, layout, state, exact, after)
    add(RULE_ORDER, order_bad)
    add(RULE_DUPLICATE, dup)
    return out


def _order_and_duplicates(
    cols: RecordColumns,
    layout: SchemaLayout,
    state: StreamState,
    exact: bool = False,
    after: RecordColumns | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """ts_event must not go backwards per instrument; a record equal to the one before it for
    the same instrument is a duplicate. Events compare on their first 48 bytes (ids, times,
    sequence, action, price, size: all but the book); bars and definitions on (id, ts_event)."""
    n = len(cols)
    order_bad = np.zeros(n, dtype=bool)
    dup = np.zeros(n, dtype=bool)
    if n == 0:
        return order_bad, dup
    iid = cols["instrument_id"]
    ts = cols["ts_event"].view(np.int64)
    bar_like = layout.name.startswith("ohlcv") or layout.name == "definition"
    key = None if bar_like else cols.header_words()  # [6, n]
    single = iid.min() == iid.max()
    perm = None if single else np.argsort(iid, kind="stable")  # per instrument, file order kept
    s_iid = iid if single else iid[perm]
    s_ts = ts if single else ts[perm]
    s_key = key if (key is None or single) else key[:, perm]
    first = np.zeros(n, dtype=bool)
    first[0] = True
    if not single:
        first[1:] = s_iid[1:] != s_iid[:-1]
    has_prev = ~first
    prev_ts = np.empty_like(s_ts)
    prev_ts[1:] = s_ts[:-1]
    prev_ts[0] = 0
    same = np.zeros(n, dtype=bool)
    if s_key is None:
        same[1:] = s_ts[1:] == s_ts[:-1]
    else:
        same[1:] = (s_key[:, 1:] == s_key[:, :-1]).all(axis=0)
    # The first record of each instrument compares with the previous chunk's last one.
    firsts = np.flatnonzero(first)
    for j in firsts.tolist():
        k = int(s_iid[j])
        if k in state.last_ts:
            has_prev[j] = True
            prev_ts[j] = state.last_ts[k]
            if s_key is None:
                same[j] = s_ts[j] == state.last_ts[k]
            else:
                same[j] = bool((s_key[:, j] == state.last_key[k]).all())
    s_order = has_prev & (s_ts < prev_ts)
    s_dup = has_prev & same
    lasts = np.append(firsts[1:], n) - 1
    last_ts = {int(s_iid[j]): int(s_ts[j]) for j in lasts.tolist()}
    if exact:
        # Per instrument whose order breaks in this chunk or right after it (a displaced last
        # record shows only against the next chunk): keep a longest non-decreasing run.
        after_ts = None if after is None else after["ts_event"].view(np.int64)
        for a, b in zip(firsts.tolist(), (lasts + 1).tolist(), strict=True):
            k = int(s_iid[a])
            ahead = None if after_ts is None else after_ts[after["instrument_id"] == k]
            if not s_order[a:b].any() and (ahead is None or not (ahead < s_ts[b - 1]).any()):
                continue
            keep = _longest_ordered_run(s_ts[a:b], ahead, state.last_ts.get(k))
            s_order[a:b] = ~keep
            if keep.any():
                last_ts[k] = int(s_ts[a:b][keep][-1])
            else:
                last_ts[k] = state.last_ts[k]
    if single:
        order_bad, dup = s_order, s_dup
    else:
        order_bad[perm] = s_order
        dup[perm] = s_dup
    state.last_ts.update(last_ts)
    if s_key is not None:
        for j in lasts.tolist():
            state.last_key[int(s_iid[j])] = s_key[:, j].copy()
    return order_bad, dup


def _longest_ordered_run(ts: np.ndarray, ahead: np.ndarray | None, floor: int | None) -> np.ndarray:
    """Which of `ts` (one instrument, file order) to keep: those in a longest non-decreasing
    subsequence of `ts` followed by `ahead` (the next chunk's, which only inform the choice),
    never below `floor` (the last kept value before this chunk). Patience sorting, O(n log n)."""
    n = len(ts)
    vals = np.concatenate([ts, ahead]) if ahead is not None and len(ahead) else ts
    lo = -(1 << 63) if floor is None else floor
    tails: list[int] = []  # smallest last value of a run of each length
    tail_at: list[int] = []  # and its position
    parent = [-1] * len(vals)
    for i, v in enumerate(vals.tolist()):
        if v < lo:
            continue
        j = bisect_right(tails, v)
        if j:
            parent[i] = tail_at[j - 1]
        if j == len(tails):
            tails.append(v)
            tail_at.append(i)
        else:
            tails[j], tail_at[j] = v, i
    keep = np.zeros(n, dtype=bool)
    i = tail_at[-1] if tail_at else -1
    while i >= 0:
        if i < n:
            keep[i] = True
        i = parent[i]
    return keep
