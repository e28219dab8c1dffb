"""DBN record layouts as numpy dtypes, so whole files are read and written as arrays.

The dtypes come from `databento_dbn`'s own record classes (`_dtypes`), so they follow the
library that defines the format rather than a copy of it. The layouts of MBP-10, trades and
OHLCV records are the same in DBN v1, v2 and v3; instrument definitions differ per version.
"""

from __future__ import annotations

from dataclasses import dataclass

import databento_dbn as dbn
import numpy as np

PRICE_SCALE = dbn.FIXED_PRICE_SCALE  # 1 unit = 1e-9 of the quote currency
UNDEF_PRICE = dbn.UNDEF_PRICE  # i64::MAX marks an empty book level or no price

# rtype codes from the DBN specification (databento_dbn.RType)
RTYPE_MBP_0 = 0x00  # trades
RTYPE_MBP_10 = 0x0A
RTYPE_INSTRUMENT_DEF = 0x13
RTYPE_OHLCV_1S = 0x20
RTYPE_OHLCV_1M = 0x21
RTYPE_OHLCV_1H = 0x22
RTYPE_OHLCV_1D = 0x23
RTYPE_OHLCV_EOD = 0x24


@dataclass(frozen=True)
class SchemaLayout:
    """How records of one schema sit in a DBN file."""

    name: str
    rtypes: tuple[int, ...]
    """rtype values a record of this schema may carry."""
    dtypes: dict[int, np.dtype]
    """Record dtype by DBN version (1, 2, 3)."""
    price_fields: tuple[str, ...]
    """Fixed-point price fields that must be positive when defined."""

    def dtype(self, version: int, ts_out: bool = False) -> np.dtype:
        base = self.dtypes[version]
        if not ts_out:
            return base
        # With ts_out every record carries the gateway send time appended.
        return np.dtype([*((n, base.fields[n][0]) for n in base.names), ("ts_out", "<u8")])


def _dt(cls) -> np.dtype:
    return np.dtype(cls._dtypes)


def _same_all_versions(cls) -> dict[int, np.dtype]:
    d = _dt(cls)
    return {1: d, 2: d, 3: d}


LEVELS = 10  # book levels of an MBP-10 record
_LEVEL_PX = tuple(f"{side}_px_{i:02d}" for i in range(LEVELS) for side in ("bid", "ask"))

SCHEMAS: dict[str, SchemaLayout] = {
    "mbp-10": SchemaLayout("mbp-10", (RTYPE_MBP_10,), _same_all_versions(dbn.MBP10Msg), ()),
    "trades": SchemaLayout("trades", (RTYPE_MBP_0,), _same_all_versions(dbn.TradeMsg), ("price",)),
    "ohlcv-1s": SchemaLayout(
        "ohlcv-1s",
        (RTYPE_OHLCV_1S,),
        _same_all_versions(dbn.OHLCVMsg),
        ("open", "high", "low", "close"),
    ),
    "ohlcv-1m": SchemaLayout(
        "ohlcv-1m",
        (RTYPE_OHLCV_1M,),
        _same_all_versions(dbn.OHLCVMsg),
        ("open", "high", "low", "close"),
    ),
    "ohlcv-1h": SchemaLayout(
        "ohlcv-1h",
        (RTYPE_OHLCV_1H,),
        _same_all_versions(dbn.OHLCVMsg),
        ("open", "high", "low", "close"),
    ),
    "ohlcv-1d": SchemaLayout(
        "ohlcv-1d",
        (RTYPE_OHLCV_1D, RTYPE_OHLCV_EOD),
        _same_all_versions(dbn.OHLCVMsg),
        ("open", "high", "low", "close"),
    ),
    "definition": SchemaLayout(
        "definition",
        (RTYPE_INSTRUMENT_DEF,),
        {
            1: _dt(dbn.v1.InstrumentDefMsg),
            2: _dt(dbn.v2.InstrumentDefMsg),
            3: _dt(dbn.v3.InstrumentDefMsg),
        },
        (),
    ),
}

SUPPORTED_SCHEMAS = tuple(SCHEMAS)
SUPPORTED_VERSIONS = (1, 2, 3)

MBP10_DTYPE = SCHEMAS["mbp-10"].dtypes[3]
TRADE_DTYPE = SCHEMAS["trades"].dtypes[3]
OHLCV_DTYPE = SCHEMAS["ohlcv-1m"].dtypes[3]

# One book level as DBN lays it out (databento_dbn.BidAskPair); LEVELS of them end an MBP-10
# record.
LEVEL_DTYPE = np.dtype(
    [
        ("bid_px", "<i8"),
        ("ask_px", "<i8"),
        ("bid_sz", "<u4"),
        ("ask_sz", "<u4"),
        ("bid_ct", "<u4"),
        ("ask_ct", "<u4"),
    ]
)
LEVELS_OFFSET = 48  # byte offset of levels[0] in an MBP-10 record
assert MBP10_DTYPE.fields["bid_px_00"][1] == LEVELS_OFFSET
