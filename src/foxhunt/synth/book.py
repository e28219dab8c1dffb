"""The demo market's book walk, compiled with numba.

Queue sizes live in a ring of RING price slots per side (price tick mod RING), and each event
assigns a new size to one slot. The walk runs through the day's events once, keeping the ring
as it is before each event: `queue_sizes` reads what an event replaces and what a price move
takes out, `fill_records` writes each record's ten visible levels (and every other field)
straight into the record array. numpy can express the same thing as a forward fill over an
[events, RING] matrix plus gathers (tests keep that version as the reference), at ~3x the cost.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from foxhunt.dbn.layout import LEVEL_DTYPE, LEVELS, LEVELS_OFFSET

# The record as 8-byte words: the levels start at word 6, four words each.
FIRST_LEVEL_WORD = LEVELS_OFFSET // 8
LEVEL_WORDS = LEVEL_DTYPE.itemsize // 8


@njit(cache=True, nogil=True)
def queue_sizes(slot, value, side_bid, direction, b_before, init_bid, init_ask, ring_mask):
    """Per event e, with the book as it is before e: `old[e]`, the size in the slot e sets on
    its side, and `left[e]`, the size of the level a move takes out (the best ask for a move up,
    else the best bid)."""
    n = len(slot)
    bid = init_bid.copy()
    ask = init_ask.copy()
    old = np.empty(n, np.int64)
    left = np.empty(n, np.int64)
    for e in range(n):
        s = slot[e]
        if direction[e] > 0:
            left[e] = ask[(b_before[e] + 1) & ring_mask]
        else:
            left[e] = bid[b_before[e] & ring_mask]
        if side_bid[e]:
            old[e] = bid[s]
            bid[s] = value[e]
        else:
            old[e] = ask[s]
            ask[s] = value[e]
    return old, left


@njit(cache=True, nogil=True)
def fill_records(
    words,
    state,
    b_state,
    px0,
    tick_ns,
    slot,
    value,
    side_bid,
    init_bid,
    init_ask,
    ring_mask,
    head0,
    instrument,
    ts_event,
    price,
    size,
    action,
    side,
    flags,
    depth,
    ts_recv,
    ts_in_delta,
    sequence,
):
    """Write MBP-10 records as their 8-byte words ([n, 46] uint64 view of the records).

    Record r shows the book in state `state[r]` (the state before event k is state k; states
    never go back), best bid at ring tick `b_state[r]` and price `px0[r]`. Words: 0 length,
    rtype, publisher_id (`head0`, the same for all) and instrument_id; 1 ts_event; 2 price;
    3 size, action, side, flags, depth; 4 ts_recv; 5 ts_in_delta, sequence; then per level
    bid_px, ask_px, bid_sz | ask_sz, bid_ct | ask_ct with ct = sz // 8 + 1."""
    bid = init_bid.copy()
    ask = init_ask.copy()
    cur = 0
    u32 = np.uint64(32)
    for r in range(len(state)):
        while cur < state[r]:  # apply the events up to this record's state
            s = slot[cur]
            if side_bid[cur]:
                bid[s] = value[cur]
            else:
                ask[s] = value[cur]
            cur += 1
        w = words[r]
        w[0] = head0 | (np.uint64(instrument[r]) << u32)
        w[1] = np.uint64(ts_event[r])
        w[2] = np.uint64(price[r])
        w[3] = (
            np.uint64(size[r])
            | (np.uint64(action[r]) << u32)
            | (np.uint64(side[r]) << np.uint64(40))
            | (np.uint64(flags[r]) << np.uint64(48))
            | (np.uint64(depth[r]) << np.uint64(56))
        )
        w[4] = np.uint64(ts_recv[r])
        w[5] = np.uint64(np.uint32(ts_in_delta[r])) | (np.uint64(sequence[r]) << u32)
        b, p0 = b_state[r], px0[r]
        for i in range(LEVELS):
            bs = bid[(b - i) & ring_mask]
            az = ask[(b + 1 + i) & ring_mask]
            k = FIRST_LEVEL_WORD + LEVEL_WORDS * i
            w[k] = np.uint64(p0 - i * tick_ns)
            w[k + 1] = np.uint64(p0 + tick_ns + i * tick_ns)
            w[k + 2] = np.uint64(bs) | (np.uint64(az) << u32)
            w[k + 3] = np.uint64((bs >> 3) + 1) | (np.uint64((az >> 3) + 1) << u32)
