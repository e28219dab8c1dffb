"""The demo market: bar-level prices and order flow, then MBP-10 events with consistent books.

The model, per root symbol, at the bar level (one bar = one minute of the session):

    h[t]     GARCH(1,1) variance, unit mean: h[t] = w + a * z[t-1]**2 * h[t-1] + b * h[t-1]
    season   U-shaped intraday variance multiplier (busy open and close), mean 1
    sigma[t] = annual_vol / sqrt(252 * bars_per_day) * sqrt(h[t] * season[t])
    s[t]     = phi * s[t-1] + sqrt(1 - phi**2) * u[t], u ~ N(0, 1): the latent order-flow
             pressure of bar t, unit variance, persistent (AR(1), `SynthConfig.persistence`)
    r[t]     = sigma[t] * (kappa * s[t] + rho * s[t-1] + c * e[t]),
             c = sqrt(1 - kappa**2 - rho**2 - 2 * kappa * rho * phi)  (unit variance in all)

So the pressure of bar t moves its own price (impact `kappa`, `SynthConfig.impact`) and the
next bar's (`rho`, `SynthConfig.signal`): prices adjust to order flow partly at once and partly
a bar later. Pressure persists, as order flow does (meta-orders are split over many minutes:
Lillo and Farmer 2004), so s[t] predicts every later return, decaying with the lag k:

    E[r[t+k] | s[t]] = sigma * (kappa * phi**k + rho * phi**(k-1)) * s[t]

At the defaults (phi 0.9, kappa 0.1, rho 0.05) the next bar's edge is 0.14 * sigma * s[t],
about what one bar's round trip costs, but it lasts: the half-life is 6.6 bars, so a policy
that holds a position while the pressure keeps its sign earns it net of the env's costs. The
returns themselves stay close to a random walk (first-order autocorrelation ~0.02).

The pressure shows in the order book through the price moves of its own bar, so the order-flow
imbalance (Cont, Kukanov, Stoikov 2014) of bar t carries s[t]. It also shows in the trades: a
decrease of the best ask is a buy trade with probability (1 + tanh(2 * flow * s[t])) / 2, a
decrease of the best bid a sell trade with the complementary one, so signed trade volume of
bar t predicts the next returns too (tests check both). Neither column is s itself: what a
policy on the observable columns can earn is below the oracle's (docs/performance.md).

Events. Inside a bar the best bid moves by whole ticks: the bar's net move round(r * price /
tick) plus Poisson pairs of up and down moves. At a move the opposite best level is gone: its
last few lots trade (a `T` record with the book before) and the rest is cancelled, and an `A`
record shows the shifted book with a thin new best level. Between moves, adds, cancels and
modifies change the size of one of the ten visible levels, and some decreases at the best level
are trades (`T`, then the `C` that shrinks the queue). The spread is always one tick; sizes and
order counts are positive on all ten levels, so books never cross.

Queue sizes live in a ring of 16 price slots per side (price tick mod 16): an event assigns a new
size to one slot. Everything else is vectorised over the day; the walk through the events that
keeps the ring, and writes each record's ten levels, is compiled (`foxhunt.synth.book`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np

from foxhunt.dbn.layout import (
    LEVELS,
    MBP10_DTYPE,
    OHLCV_DTYPE,
    PRICE_SCALE,
    RTYPE_MBP_0,
    RTYPE_MBP_10,
    RTYPE_OHLCV_1M,
    TRADE_DTYPE,
)
from foxhunt.synth import book
from foxhunt.synth.contracts import (
    SESSIONS,
    Contract,
    RootSpec,
    front_and_next,
    next_share,
    session_open_ns,
)

NS_PER_MIN = 60_000_000_000
RING = 16  # price slots per side (a power of two): more than the 10 visible levels
RING_MASK = RING - 1
PUBLISHER_GLBX = 1  # Databento publisher id of GLBX.MDP3
F_LAST = 0x80  # DBN flag: last record of an event for this instrument

GARCH_A, GARCH_B = 0.06, 0.92


@dataclass(frozen=True)
class MarketParams:
    events_per_bar: float = 40.0
    """Mean number of book events per bar (before moves), scaled by intraday activity."""
    signal: float = 0.05
    """rho: loading of bar t+1's return on bar t's order-flow pressure (the lagged impact)."""
    impact: float = 0.1
    """kappa: loading of bar t's return on its own order-flow pressure (the immediate impact)."""
    persistence: float = 0.9
    """phi: autocorrelation of the pressure from one bar to the next (AR(1))."""
    flow: float = 1.0
    """How strongly the pressure shows in trades and queues during its own bar."""
    roll_days: int = 8
    """Trading days before expiry in which the expiring and the next contract both trade."""
    session: str = "rth"
    """'rth' (08:30-15:00 Central, 390 bars) or 'eth' (23 hours)."""


@dataclass
class BarPath:
    """Bar-level latent path of one root over all days."""

    days: list[dt.date]
    bars_per_day: int
    close_ticks: np.ndarray  # [days, bars] best bid at bar close, in ticks of the front contract
    open_ticks: np.ndarray  # [days] best bid before the first event of the day
    pressure: np.ndarray  # [days, bars] s[t]
    activity: np.ndarray  # [days, bars] relative event rate
    sigma: np.ndarray  # [days, bars]


def seasonality(bars: int) -> np.ndarray:
    m = np.arange(bars, dtype=np.float64)
    season = 1.0 + 1.5 * np.exp(-m / 25.0) + 1.0 * np.exp(-(bars - 1 - m) / 25.0)
    return season / season.mean()


def bar_path(spec: RootSpec, days: list[dt.date], p: MarketParams, seed: int) -> BarPath:
    rng = np.random.default_rng([seed, _root_key(spec.root), 0])
    bars = SESSIONS[p.session][1]
    n = len(days) * bars
    z = rng.standard_normal(n)
    u = rng.standard_normal(n)
    h = np.empty(n)
    s = np.empty(n)
    hv, sv = 1.0, 0.0
    w = 1.0 - GARCH_A - GARCH_B
    phi = p.persistence
    innov = np.sqrt(1.0 - phi * phi)
    # Sequential recursions over bars (not events): ~50k steps per half-year of RTH minutes.
    for t in range(n):
        h[t] = hv
        hv = w + GARCH_A * z[t] * z[t] * hv + GARCH_B * hv
        sv = phi * sv + innov * u[t] if t else u[0]
        s[t] = sv
    season = np.tile(seasonality(bars), len(days))
    sigma = spec.annual_vol / np.sqrt(252.0 * bars) * np.sqrt(h * season)
    rho, kappa = p.signal, p.impact
    s_prev = np.concatenate([[0.0], s[:-1]])
    r = sigma * (kappa * s + rho * s_prev + noise_loading(kappa, rho, phi) * z)
    # Overnight gap at each day's first bar: a few bars' worth of variance.
    gaps = np.zeros(n)
    gaps[::bars] = rng.standard_normal(len(days)) * spec.annual_vol / np.sqrt(252.0) * 0.3
    gaps[0] = 0.0
    log_p = np.log(spec.start_price) + np.cumsum(r + gaps)
    close_ticks = np.rint(np.exp(log_p) / spec.tick).astype(np.int64)
    open_ticks = np.rint(np.exp(log_p - r) / spec.tick).astype(np.int64)[::bars]
    activity = np.sqrt(h * season)
    return BarPath(
        days=days,
        bars_per_day=bars,
        close_ticks=close_ticks.reshape(len(days), bars),
        open_ticks=open_ticks,
        pressure=s.reshape(len(days), bars),
        activity=activity.reshape(len(days), bars),
        sigma=sigma.reshape(len(days), bars),
    )


def noise_loading(kappa: float, rho: float, phi: float) -> float:
    """c of the return equation: what keeps a bar's return at unit variance (before sigma)."""
    c2 = 1.0 - kappa * kappa - rho * rho - 2.0 * kappa * rho * phi
    if c2 < 0:
        raise ValueError(
            f"impact {kappa}, signal {rho}, persistence {phi}: impact**2 + signal**2 + "
            f"2 * impact * signal * persistence = {1 - c2:.3f} must be <= 1 (they load a "
            "return of unit variance)"
        )
    return float(np.sqrt(c2))


def _root_key(root: str) -> int:
    return int.from_bytes(root.encode()[:8].ljust(8, b"\0"), "little")


def quarter_index(c: Contract) -> int:
    return c.expiry.year * 4 + (c.expiry.month - 1) // 3


@dataclass
class DayRecords:
    mbp10: np.ndarray  # MBP10_DTYPE, sorted by ts_recv, all contracts of the root
    contracts: list[Contract]


def day_records(
    spec: RootSpec, path: BarPath, day_idx: int, p: MarketParams, seed: int, base_quarter: int
) -> DayRecords:
    """All MBP-10 records of one root on one trading day."""
    day = path.days[day_idx]
    rng = np.random.default_rng([seed, _root_key(spec.root), 1 + day_idx])
    bars = path.bars_per_day
    s = path.pressure[day_idx]
    close = path.close_ticks[day_idx]
    b_open = int(path.open_ticks[day_idx])
    prev_close = np.concatenate([[b_open], close[:-1]])
    d = close - prev_close  # net tick move per bar

    # --- events per bar -----------------------------------------------------------------
    k = rng.poisson(0.3 * path.activity[day_idx])  # up/down pairs of noise moves
    n_moves = np.abs(d) + 2 * k
    n_other = rng.poisson(p.events_per_bar * path.activity[day_idx])
    per_bar = n_moves + n_other
    n_ev = int(per_bar.sum())
    bar_of = np.repeat(np.arange(bars), per_bar)
    starts = np.cumsum(per_bar) - per_bar
    j = np.arange(n_ev) - np.repeat(starts, per_bar)
    ad = np.abs(d)[bar_of]
    is_move = j < n_moves[bar_of]
    direction = np.where(j < ad, np.sign(d)[bar_of], np.where(j - ad < k[bar_of], 1, -1))
    direction = np.where(is_move, direction, 0).astype(np.int64)

    # Event times: uniform inside the bar; sorting by time shuffles moves and other events.
    t0 = session_open_ns(day, p.session)
    ts = t0 + bar_of.astype(np.int64) * NS_PER_MIN + rng.integers(1, NS_PER_MIN - 1, n_ev)
    order = np.argsort(ts, kind="stable")
    ts, bar_of, is_move, direction = ts[order], bar_of[order], is_move[order], direction[order]

    b_after = b_open + np.cumsum(direction)  # best bid tick after each event
    b_before = b_after - direction
    s_ev = s[bar_of]

    # --- which queue each event sets, and to what -----------------------------------------
    side_bid = rng.random(n_ev) < 0.5  # book side of the assignment
    level = np.minimum((np.log(rng.random(n_ev)) / np.log(0.5)).astype(np.int64), LEVELS - 1)
    # A move up puts a new best bid at the old best ask; a move down a new best ask.
    side_bid = np.where(is_move, direction > 0, side_bid)
    level = np.where(is_move, 0, level)
    tick = np.where(side_bid, b_after - level, b_after + 1 + level)
    slot = tick & RING_MASK
    shape = spec.base_size * (1.0 + 0.25 * level)
    # A level a move opens starts thin: a few orders join the new best price first.
    shape = np.where(is_move, 0.25 * spec.base_size, shape)
    value = np.maximum(1, np.rint(shape * rng.lognormal(0.0, 0.6, n_ev))).astype(np.int32)

    init = np.maximum(1, np.rint(spec.base_size * rng.lognormal(0.0, 0.6, (2, RING))))
    init = init.astype(np.int32)
    # The book before each event: the size the event replaces and, for a move, the size of the
    # opposite best level. Moves: that level is gone afterwards. Its last lots trade (the T
    # record) and the rest is cancelled, as queues mostly thin out by cancels before the price
    # moves; whole-queue trades would swamp the planted flow with the return itself.
    old, level_left = book.queue_sizes(
        slot, value, side_bid, direction, b_before, init[0], init[1], RING_MASK
    )
    delta = value.astype(np.int64) - old
    rows = np.arange(n_ev)

    # Some decreases at the best level are trades; pressure decides the aggressor side. (Queue
    # sizes carry no pressure: bigger bid queues under buying pressure would make the moves
    # down, which take out a whole queue, sell more and cancel the signal out.)
    buy_pressure = 0.5 * (1.0 + np.tanh(2.0 * p.flow * s_ev))
    p_trade = np.where(side_bid, 1.0 - buy_pressure, buy_pressure)
    is_trade = (~is_move) & (level == 0) & (delta < 0) & (rng.random(n_ev) < p_trade)
    last_lots = np.rint(0.1 * spec.base_size * rng.lognormal(0.0, 0.6, n_ev))
    taken = np.clip(last_lots, 1, level_left).astype(np.int64)
    keep = is_move | (delta != 0)

    # --- records: a trade is a T (book before) followed by its book update -----------------
    two = keep & (is_move | is_trade)
    n_rec_ev = keep.astype(np.int64) + two
    ev_of = np.repeat(rows, n_rec_ev)
    first = np.concatenate([[True], ev_of[1:] != ev_of[:-1]])
    is_t = two[ev_of] & first
    state = np.where(is_t, ev_of, ev_of + 1)

    n_rec = len(ev_of)
    rec = np.empty(n_rec, dtype=MBP10_DTYPE)  # every byte is set below
    tick_ns = round(spec.tick * PRICE_SCALE)
    b_state = np.concatenate([[b_open], b_after])[state]
    mv = is_move[ev_of]
    dir_r = direction[ev_of]
    sb = side_bid[ev_of]
    trade_px_tick = np.where(
        mv, np.where(dir_r > 0, b_before[ev_of] + 1, b_before[ev_of]), tick[ev_of]
    )
    size = np.where(is_t & mv, taken[ev_of], np.where(mv, value[ev_of], np.abs(delta[ev_of])))
    # Aggressor side for trades: buying lifts the ask. Book side for the rest.
    aggressor_buy = np.where(mv, dir_r > 0, ~sb)
    action = np.where(
        is_t,
        b"T",
        np.where(mv | (delta[ev_of] > 0), b"A", b"C"),
    )
    modify = (~is_t) & (~mv) & (rng.random(n_rec) < 0.1)
    action = np.where(modify, b"M", action)
    side = np.where(is_t, np.where(aggressor_buy, b"B", b"A"), np.where(sb, b"B", b"A"))
    price_tick = np.where(is_t, trade_px_tick, tick[ev_of])

    latency = rng.integers(2_000, 40_000, n_rec)
    ts_in_delta = rng.integers(1_000, 20_000, n_rec)

    # --- contracts: during the roll both trade; the next one at the front price + basis ------
    front, nxt = front_and_next(spec.root, day)
    share = next_share(day, front, p.roll_days)
    in_next = (rng.random(n_ev) < share)[ev_of]
    basis_ticks = round(spec.start_price * spec.basis_per_quarter / spec.tick)
    off_front = (quarter_index(front) - base_quarter) * basis_ticks
    off_next = (quarter_index(nxt) - base_quarter) * basis_ticks
    offset = np.where(in_next, off_next, off_front)
    instrument = np.where(in_next, nxt.instrument_id, front.instrument_id)
    # Exchange sequence numbers per instrument; gateway receive time after the event.
    seq = np.empty(n_rec, dtype=np.int64)
    for iid in (front.instrument_id, nxt.instrument_id):
        m = instrument == iid
        seq[m] = 1_000 + np.arange(int(m.sum()))
    book.fill_records(
        words=rec.view(np.uint64).reshape(n_rec, -1),
        state=state,
        b_state=b_state,
        px0=(b_state + offset) * tick_ns,
        tick_ns=tick_ns,
        slot=slot,
        value=value,
        side_bid=side_bid,
        init_bid=init[0],
        init_ask=init[1],
        ring_mask=RING_MASK,
        head0=np.uint64(MBP10_DTYPE.itemsize // 4 | RTYPE_MBP_10 << 8 | PUBLISHER_GLBX << 16),
        instrument=instrument,
        ts_event=ts[ev_of],
        price=(price_tick + offset) * tick_ns,
        size=size,
        action=action.view(np.uint8),
        side=side.view(np.uint8),
        flags=np.where(is_t, 0, F_LAST),
        depth=np.where(is_t | mv, 0, level[ev_of]),
        ts_recv=np.maximum.accumulate(ts[ev_of] + latency),
        ts_in_delta=ts_in_delta,
        sequence=seq,
    )
    contracts = [front] if share == 0.0 else [front, nxt]
    return DayRecords(rec, contracts)


def trades_from_mbp(mbp: np.ndarray) -> np.ndarray:
    """The trades schema is the MBP-10 stream's `T` records without the book."""
    # A trade record is byte for byte the first 48 bytes of an MBP-10 record.
    raw = mbp.view(np.uint8).reshape(len(mbp), mbp.dtype.itemsize)
    out = np.ascontiguousarray(raw[mbp["action"] == b"T", : TRADE_DTYPE.itemsize])
    out = out.view(TRADE_DTYPE).reshape(-1)
    out["length"] = TRADE_DTYPE.itemsize // 4
    out["rtype"] = RTYPE_MBP_0
    return out


def ohlcv_from_trades(trades: np.ndarray, interval_ns: int = NS_PER_MIN) -> np.ndarray:
    """OHLCV bars per instrument and interval from trades, as Databento builds them: a bar's
    ts_event is its interval's start, and intervals without trades have no bar."""
    bucket = trades["ts_event"] // np.uint64(interval_ns)
    order = np.lexsort((trades["ts_event"], trades["instrument_id"], bucket))
    t = trades[order]
    key = bucket[order] * np.uint64(1 << 32) + t["instrument_id"].astype(np.uint64)
    starts = np.flatnonzero(np.concatenate([[True], key[1:] != key[:-1]])) if len(t) else []
    out = np.zeros(len(starts), dtype=OHLCV_DTYPE)
    if len(t) == 0:
        return out
    px = t["price"]
    ends = np.append(starts[1:], len(t)) - 1
    out["length"] = OHLCV_DTYPE.itemsize // 4
    out["rtype"] = RTYPE_OHLCV_1M
    out["publisher_id"] = t["publisher_id"][starts]
    out["instrument_id"] = t["instrument_id"][starts]
    out["ts_event"] = bucket[order][starts] * np.uint64(interval_ns)
    out["open"] = px[starts]
    out["close"] = px[ends]
    out["high"] = np.maximum.reduceat(px, starts)
    out["low"] = np.minimum.reduceat(px, starts)
    out["volume"] = np.add.reduceat(t["size"].astype(np.uint64), starts)
    return out
