"""Which rows of a tile fight over one L1 set: the host's L1 sets and a conflict test.

A tiled kernel (a transposed read) walks ``rows`` rows of its row-major buffers at once:
tile after tile along a row, each tile touching the same ``rows`` cache lines of every
row-major buffer again (the next part of each line). Where a buffer's row stride in bytes
is a multiple of the L1's sets x line bytes (4 KB: x.t() + y with x of 512 x 2048 bf16),
all those lines fall in one set. Measured on a 64-set, 12-way L1 (AMD EPYC, bf16
x.t() + y, us for 16-row / 32-row tiles): strides of 4 and 8 KB 127/216, 107/216,
222/436, 65/118 (16 rows win); strides of 1, 2 and 3 KB and odd ones 118/95, 100/98,
95/90, 59/57, 78/80, 90/81 (32 rows win or tie: a 16-row tile reads each 64-byte line of
the transposed input half at a time).
"""
from __future__ import annotations

import functools
from pathlib import Path

LINE_BYTES = 64
DEFAULT_SETS = 64      # 32 or 48 KB L1Ds of current x86 cores: 64 sets of 64-byte lines


@functools.lru_cache(maxsize=None)
def l1_sets() -> int:
    """Sets of this CPU's L1 data cache (sysfs), or DEFAULT_SETS where unknown."""
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for index in sorted(base.glob("index*")):
            if (index / "level").read_text().strip() == "1" and \
                    (index / "type").read_text().strip() in ("Data", "Unified"):
                sets = int((index / "number_of_sets").read_text())
                if sets > 0:
                    return sets
    except (OSError, ValueError):
        pass
    return DEFAULT_SETS


def rows_share_one_set(row_strides_bytes: list[int]) -> bool:
    """Whether every row of some row-major buffer falls in the same L1 set: its row stride
    a multiple of sets x line bytes (4 KB on 64-set caches). A tile's rows of such a buffer
    all compete for that one set's ways, tile after tile."""
    period = l1_sets() * LINE_BYTES
    return any(stride > 0 and stride % period == 0 for stride in row_strides_bytes)
