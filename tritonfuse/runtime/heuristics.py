"""Candidate launch configs for generated Triton kernels, chosen from the sizes alone.

Each kernel kind gets a short ordered list of `Config`s. The first element is the single
best guess (what runs when autotuning is off); "default" adds a handful of alternatives
that cover the usual failure modes of that guess, "max" a wider sweep. All block sizes
are powers of two, never much larger than the (next power of two of the) numel they
tile, and the elements one program holds are capped so the work fits in registers.

The numbers follow what is known to work for memory-bound kernels on Hopper-class GPUs
(132 SMs, 32-thread warps): pointwise blocks of ~1024 elements with 4 warps (8 elements
per thread, enough bytes in flight per SM), reductions with 128 elements per warp, and
looped reductions that either read one long contiguous row per program (inner) or many
short columns (outer).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

# Largest next_power_of_2(r) for which a reduction keeps the whole row in registers
# (fp32 accumulators). Above it the code generator should emit a looped reduction.
# 4096 rather than 1024: on an H200, rows of 2048 held in registers made layer norm
# 1.29x and x - softmax(x) 1.18x faster than looping over them twice.
PERSISTENT_REDUCTION_MAX_RBLOCK = 4096
# An "outer" reduction (x contiguous in memory) needs XBLOCK >= this many x for
# coalesced loads; a persistent one holding whole rows of r cannot have it when r is long.
OUTER_MIN_XBLOCK = 32
# Elements one program holds for looped reductions (XBLOCK * RBLOCK).
REDUCTION_MAX_BLOCK_ELEMENTS = 4096
# Elements one program holds for persistent reductions; whole rows live in registers.
PERSISTENT_MAX_BLOCK_ELEMENTS = 4096
# Elements one program handles for pointwise kernels.
POINTWISE_MAX_BLOCK_ELEMENTS = 4096
# The largest single block dimension Triton accepts comfortably.
MAX_BLOCK = 4096
# CUDA limits grid dims y and z to 65535 (x may go to 2**31 - 1).
MAX_GRID_YZ = 65535
# The autotuning budget: a kernel over fewer elements than this runs in a few
# microseconds whatever its launch config (launch latency dominates), so "default" mode
# compiles and runs only the first config; "max" still tries them all.
TUNE_MIN_ELEMENTS = 1 << 16

KINDS = ("pointwise", "pointwise_2d", "reduction", "persistent_reduction")
MODES = ("none", "default", "max")
# The integer arguments of each kind of kernel, in signature order (after the pointers).
NUMEL_ARGS = {"pointwise": ("x",), "pointwise_2d": ("y", "x"), "reduction": ("x", "r"),
              "persistent_reduction": ("x", "r")}


@dataclasses.dataclass(frozen=True)
class Config:
    """One launch config: constexpr block sizes plus the launch options of the kernel.

    ``kwargs`` maps the kernel's constexpr block names (XBLOCK, YBLOCK, RBLOCK) to ints.
    """

    kwargs: dict
    num_warps: int
    num_stages: int = 1

    def __post_init__(self) -> None:
        # One canonical order (YBLOCK, XBLOCK, RBLOCK, then others by name), so str() and
        # to_dict() agree however the config was spelled or read back from JSON.
        order = {"YBLOCK": 0, "XBLOCK": 1, "RBLOCK": 2}
        items = sorted(self.kwargs.items(), key=lambda kv: (order.get(kv[0], 3), kv[0]))
        object.__setattr__(self, "kwargs", dict(items))

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.kwargs.items())), self.num_warps, self.num_stages))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: {"kwargs": {...}, "num_warps": n, "num_stages": n}."""
        return {
            "kwargs": {k: int(v) for k, v in self.kwargs.items()},
            "num_warps": int(self.num_warps),
            "num_stages": int(self.num_stages),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Config":
        """Inverse of `to_dict`; raises KeyError/TypeError/ValueError on malformed input."""
        kwargs = d["kwargs"]
        if not isinstance(kwargs, dict):
            raise TypeError(f"config kwargs must be a dict, got {type(kwargs).__name__}")
        return cls(
            kwargs={str(k): int(v) for k, v in kwargs.items()},
            num_warps=int(d["num_warps"]),
            num_stages=int(d.get("num_stages", 1)),
        )

    def __str__(self) -> str:
        blocks = ", ".join(f"{k}={v}" for k, v in self.kwargs.items())
        return f"{blocks}, num_warps={self.num_warps}, num_stages={self.num_stages}"


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _clamp_pow2(value: int, lo: int, hi: int) -> int:
    """`value` rounded down to a power of two, then clamped to [lo, hi]."""
    value = max(1, int(value))
    value = 1 << (value.bit_length() - 1)
    return max(lo, min(hi, value))


def _fit_warps(num_warps: int, block_elements: int) -> int:
    """Never more threads than elements: idle lanes only cost registers and syncs."""
    return max(1, min(num_warps, _clamp_pow2(block_elements // 32, 1, 32)))


def pointwise_num_warps(block_elements: int) -> int:
    """~256 elements per warp (8 per thread), between 1 and 8 warps."""
    return _clamp_pow2(block_elements // 256, 1, 8)


def reduction_num_warps(block_elements: int, max_warps: int = 8) -> int:
    """~128 elements per warp; reductions gain from more warps in flight, so at least 2."""
    return _clamp_pow2(block_elements // 128, 2, max_warps)


def is_persistent_reduction_ok(numels: dict[str, int], hint: str | None = None) -> bool:
    """True if a whole reduction row (next_power_of_2(r) elements) fits in registers, and,
    for an outer reduction, OUTER_MIN_XBLOCK rows of it still fit in one program."""
    rp = next_power_of_2(numels["r"])
    if hint == "outer" and rp * OUTER_MIN_XBLOCK > PERSISTENT_MAX_BLOCK_ELEMENTS:
        return False
    return rp <= PERSISTENT_REDUCTION_MAX_RBLOCK


def candidate_configs(kind: str, numels: dict[str, int], mode: str = "default",
                      *, hint: str | None = None, max_xblock: int | None = None) -> list[Config]:
    """Ordered launch configs for a kernel of `kind` over `numels`.

    kind: "pointwise" ({"x"}), "pointwise_2d" ({"y", "x"}), "reduction" (looped, {"x", "r"})
    or "persistent_reduction" ({"x", "r"}). mode: "none" (exactly one config, the best
    guess), "default" (a handful) or "max" (a wider sweep). The first config is the same
    in every mode. hint: optional "inner" (reduce over the contiguous dim, the default
    guess) or "outer" (reduce over a strided dim) for reductions. max_xblock: the largest
    XBLOCK the kernel allows (one generated without xmask for a static row count that
    every XBLOCK up to it divides); wider configs are narrowed to it.
    """
    if mode not in MODES:
        raise ValueError(f"unknown autotune mode {mode!r}; expected one of {MODES}")
    builders = {
        "pointwise": _pointwise,
        "pointwise_2d": _pointwise_2d,
        "reduction": _reduction,
        "persistent_reduction": _persistent_reduction,
    }
    if kind not in builders:
        raise ValueError(f"unknown kernel kind {kind!r}; expected one of {KINDS}")
    numels = {k: max(1, int(v)) for k, v in numels.items()}
    if kind in ("reduction", "persistent_reduction"):
        configs = builders[kind](numels, mode, hint)
    else:
        configs = builders[kind](numels, mode)
    if max_xblock is not None:
        configs = [cfg if cfg.kwargs.get("XBLOCK", 1) <= max_xblock else
                   dataclasses.replace(cfg, kwargs={**cfg.kwargs, "XBLOCK": max_xblock}) for cfg in configs]
    configs = _dedupe(configs)
    if mode == "none" or (mode == "default" and math.prod(numels.values()) < TUNE_MIN_ELEMENTS):
        return configs[:1]
    return configs


def size_key(kind: str, numels: dict[str, int]) -> tuple:
    """The sizes a kernel of static sizes has its launch config chosen (and its tuning
    result kept) for: exactly its numels."""
    return (kind,) + tuple((axis, int(numels[axis])) for axis in NUMEL_ARGS[kind])


def size_bucket(kind: str, numels: dict[str, int]) -> tuple:
    """The same for a kernel of symbolic sizes: its launches are grouped in buckets of
    each numel's next power of two, and each bucket is tuned once."""
    return (kind,) + tuple((axis, next_power_of_2(int(numels[axis]))) for axis in NUMEL_ARGS[kind])


def _dedupe(configs: list[Config]) -> list[Config]:
    seen: set[Config] = set()
    out = []
    for cfg in configs:
        if cfg not in seen:
            seen.add(cfg)
            out.append(cfg)
    return out


# --- pointwise ---------------------------------------------------------------------------

def _pointwise(numels: dict[str, int], mode: str) -> list[Config]:
    x = numels["x"]
    xp = next_power_of_2(x)
    # Aim for >= ~128 programs once there is enough work, blocks of 256..1024 elements
    # (a power of two: tl.arange needs one).
    guess = min(xp, _clamp_pow2(x // 128, 256, 1024))

    def make(xblock: int, warps: int | None = None) -> Config:
        xblock = max(1, min(xblock, xp))
        return Config({"XBLOCK": xblock}, _fit_warps(warps or pointwise_num_warps(xblock), xblock))

    configs = [make(guess)]
    # "default" tunes no 1-D pointwise kernel: over the 22 distinct ones of Llama's,
    # GPT-2's and ViT's training graphs on an H200 (393k to 24.6M elements, bf16), the
    # fastest of today's alternatives (XBLOCK 512-2048, 2-8 warps) beat this guess by a
    # median 1.002x and at most 1.08x, for three compiles and a race per kernel.
    if mode == "max":
        configs += [make(guess * 2), make(guess // 2), make(1024), make(guess, 8)]
        for xblock in (128, 256, 512, 1024, 2048, POINTWISE_MAX_BLOCK_ELEMENTS):
            natural = pointwise_num_warps(xblock)
            for warps in (natural, natural * 2, max(1, natural // 2)):
                configs.append(make(xblock, min(warps, 16)))
    return configs


def _pointwise_2d(numels: dict[str, int], mode: str) -> list[Config]:
    """Tiles for kernels indexing two dims (transposes): x contiguous on grid axis 0."""
    y, x = numels["y"], numels["x"]
    yp, xp = next_power_of_2(y), next_power_of_2(x)
    # Grid axis 1 (y) is limited to 65535 programs: YBLOCK must be at least this.
    min_yblock = next_power_of_2(-(-y // MAX_GRID_YZ))

    def make(yblock: int, xblock: int, warps: int | None = None) -> Config:
        yblock = max(min(yblock, yp), min_yblock)
        xblock = min(xblock, xp)
        while yblock * xblock > POINTWISE_MAX_BLOCK_ELEMENTS and xblock > 1:
            xblock //= 2
        warps = _fit_warps(warps or pointwise_num_warps(yblock * xblock), yblock * xblock)
        return Config({"YBLOCK": yblock, "XBLOCK": xblock}, warps)

    # Best guess: a square-ish 1024-element tile; if one dim is short, give the other
    # dim the rest so a program still moves ~1024 elements.
    gx = min(xp, 32) if yp >= 32 else min(xp, max(32, 1024 // yp))
    gy = min(yp, max(1, 1024 // gx))
    configs = [make(gy, gx)]
    if mode in ("default", "max"):
        configs += [make(64, 64), make(16, 256), make(256, 16), make(1, 1024)]
    if mode == "max":
        for yblock, xblock in ((8, 128), (128, 8), (32, 64), (64, 32), (128, 128),
                               (1, 2048), (4, 256), (32, 32)):
            natural = pointwise_num_warps(yblock * xblock)
            configs += [make(yblock, xblock, natural), make(yblock, xblock, min(natural * 2, 16))]
    return configs


# --- reductions ---------------------------------------------------------------------------

def _reduction(numels: dict[str, int], mode: str, hint: str | None) -> list[Config]:
    """Looped reductions: each program walks r in RBLOCK steps for XBLOCK rows."""
    x, r = numels["x"], numels["r"]
    xp, rp = next_power_of_2(x), next_power_of_2(r)

    def make(xblock: int, rblock: int, warps: int | None = None, stages: int = 1) -> Config:
        xblock, rblock = min(xblock, xp), min(rblock, rp, MAX_BLOCK)
        while xblock * rblock > REDUCTION_MAX_BLOCK_ELEMENTS:
            if xblock >= rblock and xblock > 1:
                xblock //= 2
            else:
                rblock //= 2
        warps = _fit_warps(warps or reduction_num_warps(xblock * rblock), xblock * rblock)
        return Config({"XBLOCK": xblock, "RBLOCK": rblock}, warps, stages)

    # Inner: one long contiguous row per program, wide RBLOCK for coalesced loads.
    # Short rows: several rows per program so a program still has ~512 elements.
    inner = make(max(1, 512 // rp), 2048) if rp < 512 else make(1, 2048)
    # Outer: r is strided and neighbouring x are contiguous. What fills an H200 is
    # programs: one per 512 x (8 to 64 x each, 2048 elements, 8 warps). Llama's, GPT-2's
    # and ViT's column sums (x 3072-12288, r 768-1576) all tuned to 8-16 x per program,
    # and ran 1.2-6.8x faster than with the 32-64 x wide tiles of fewer programs (those
    # stay below).
    outer_x = _clamp_pow2(x // 512, 8, 64)
    outer = make(outer_x, max(8, 2048 // outer_x), 8)
    configs = [outer] if hint == "outer" else [inner]
    if mode in ("default", "max"):
        if hint == "outer":
            # longer r steps; twice the x per program; the wide coalescing tile; and for
            # long rows the inner form (a cross-entropy backward over 32000 classes that
            # reads one input along x tuned to it; on shorter rows it lost up to 960x)
            configs += [make(outer_x, 4096 // outer_x, 8), make(2 * outer_x, 1024 // outer_x, 8), make(64, 32, 8)]
            if rp >= 4096:
                configs.append(inner)
        else:
            configs += [make(1, 1024), make(8, 512), make(2 * max(1, 256 // rp), 256)]
            if rp >= 4096:
                # long rows: a 4096-wide step with 16 warps measured best on an H200
                # (32768-wide softmax 0.184 ms against 0.203 for 1024-wide steps)
                configs.append(make(1, 4096, 16))
    if mode == "max":
        configs += [make(1, 1024), make(8, 512), make(64, 64), make(2 * max(1, 256 // rp), 256),
                    make(8, 256), make(16, 128), make(128, 16), make(64, 32, 8),
                    make(_clamp_pow2(xp // 128, 32, 64), 16)]
        configs += [make(1, 4096, 16), make(1, 512), make(4, 1024), make(16, 256),
                    make(32, 128), make(128, 8), make(64, 4, 8), make(128, 32)]
        # Software pipelining of the r-loop loads can pay off on Hopper.
        for cfg in configs[:4]:
            configs.append(dataclasses.replace(cfg, num_stages=2))
    return configs


def _persistent_reduction(numels: dict[str, int], mode: str, hint: str | None) -> list[Config]:
    """Persistent reductions: RBLOCK covers the whole row; only XBLOCK/num_warps vary."""
    x, r = numels["x"], numels["r"]
    xp, rp = next_power_of_2(x), next_power_of_2(r)
    max_warps = 16 if rp >= 4096 else 8
    max_xblock = max(1, min(xp, 128, PERSISTENT_MAX_BLOCK_ELEMENTS // rp))

    def make(xblock: int, warps: int | None = None) -> Config:
        xblock = max(1, min(xblock, max_xblock))
        warps = _fit_warps(warps or reduction_num_warps(xblock * rp, max_warps), xblock * rp)
        return Config({"XBLOCK": xblock, "RBLOCK": rp}, warps)

    # Fill a program with ~PERSISTENT_MAX_BLOCK_ELEMENTS (4 rows of 1024, 32 rows of 128:
    # measured best on H200 for softmax / norms), but keep >= ~128 programs when x allows.
    guess = make(min(PERSISTENT_MAX_BLOCK_ELEMENTS // rp, _clamp_pow2(x // 128, 1, 128)))
    configs = [make(64 if rp <= 64 else 8), guess] if hint == "outer" else [guess]
    xb, half = guess.kwargs["XBLOCK"], max(1, guess.num_warps // 2)
    if mode == "default" and hint != "outer" and rp >= 256:
        # rows of 256 and more read along r: on an H200, over the norms and softmaxes of
        # Llama's, GPT-2's and ViT's training graphs, the best of these three came within
        # 1.07x of the best of all nine below (half the rows per program won most often;
        # half the warps: more programs resident per SM)
        configs += [make(xb // 2), make(xb // 2, half)]
    elif mode in ("default", "max"):
        configs += [make(xb // 2), make(xb * 2), make(1), make(8), make(32), make(128)]
        # half the warps: more programs resident per SM (bf16 softmax over 1024-wide rows
        # ran 5% faster on an H200 with XBLOCK=2 and 4 warps than with 8)
        configs += [make(xb, half), make(xb // 2, half)]
    if mode == "max":
        for xblock in (1, 2, 4, 8, 16, 32, 64, 128):
            natural = reduction_num_warps(min(xblock, max_xblock) * rp, max_warps)
            for warps in (natural, natural * 2, natural // 2):
                if 1 <= warps <= max_warps:
                    configs.append(make(xblock, warps))
    return configs
