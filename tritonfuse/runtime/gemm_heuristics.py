"""Candidate configs of the GEMM template, chosen from the problem's sizes.

A config is a tile (BLOCK_M x BLOCK_N, stepping BLOCK_K along k), GROUP_M (tile rows that
walk the columns together), warps and pipeline stages. The list starts from tiles known
to do well on Hopper-class GPUs in bf16/fp16 (the Triton matmul tutorial's and Inductor's
lists: 128x256x64 with 8 warps and 3 stages is the one that matches cuBLAS on large
problems) and is pruned by the problem:

  * blocks never exceed the (power-of-two-rounded) size they tile, at least 16 (the
    smallest tile tl.dot takes); duplicates that this clamping makes are dropped;
  * the pipeline's shared memory (stages x (BLOCK_M + BLOCK_N) x BLOCK_K elements) must
    fit the device: stages are cut down to 2, else the tile is dropped;
  * the first config, the one used when nothing is benchmarked, is the largest tile that
    still gives every multiprocessor a program (``min_programs``), else the one that
    gives the most programs;
  * tiles much smaller than that one (under 1/8 of its area) are dropped: they only add
    compile time where large tiles fill the device;
  * without tensor cores (float32 operands, TF32 off: the products run on the FMA units)
    tiles stay within 128x128x32: larger ones take tens of seconds to compile and spill.
"""
from __future__ import annotations

from .heuristics import Config, next_power_of_2

# (BLOCK_M, BLOCK_N, BLOCK_K, num_stages, num_warps), largest tiles first.
MM_TILES = (
    (128, 256, 64, 3, 8),
    (256, 128, 64, 3, 8),
    (128, 128, 64, 4, 8),
    (128, 128, 64, 3, 4),
    (128, 128, 32, 4, 4),
    (64, 256, 32, 4, 4),
    (128, 64, 64, 4, 4),
    (64, 128, 64, 4, 4),
    (64, 64, 64, 4, 4),
    (128, 32, 32, 4, 4),
    (64, 32, 32, 5, 2),
    (32, 64, 32, 5, 2),
    (32, 32, 32, 3, 2),
    (16, 32, 64, 3, 2),
)
GROUP_M = 8
FMA_MAX_TILE = 128 * 128
FMA_MAX_BLOCK_K = 32
MIN_BLOCK = 16      # tl.dot needs every dim of both operands >= 16
MIN_STAGES = 2


def _clamp(block: int, size: int) -> int:
    return max(MIN_BLOCK, min(block, next_power_of_2(size)))


def mm_configs(batch: int, m: int, n: int, k: int, itemsize: int, *, min_programs: int,
               shared_memory: int | None = None, tensor_cores: bool = True) -> list[Config]:
    """Ordered candidate configs for ``batch`` products of [m, k] x [k, n] with operands
    of ``itemsize`` bytes; ``shared_memory``: bytes a program may use (None: no limit)."""
    configs, seen = [], set()
    for block_m, block_n, block_k, stages, warps in MM_TILES:
        if not tensor_cores:
            if block_m * block_n > FMA_MAX_TILE:
                continue
            block_k = min(block_k, FMA_MAX_BLOCK_K)
        block_m, block_n, block_k = _clamp(block_m, m), _clamp(block_n, n), _clamp(block_k, k)
        per_stage = (block_m + block_n) * block_k * itemsize
        if shared_memory is not None:
            stages = min(stages, shared_memory // per_stage)
            if stages < MIN_STAGES:
                continue
        # no more warps than 16x16 pieces of the tile to work on
        warps = max(1, min(warps, block_m * block_n // 256))
        config = Config({"BLOCK_M": block_m, "BLOCK_N": block_n, "BLOCK_K": block_k, "GROUP_M": GROUP_M},
                        warps, stages)
        if config not in seen:
            seen.add(config)
            configs.append(config)
    if not configs:
        return []
    first = _first_guess(configs, batch, m, n, min_programs)
    return [first] + [c for c in configs if c is not first and _area(c) * SMALLEST_TILE_FRACTION >= _area(first)]


SMALLEST_TILE_FRACTION = 8


def _area(config: Config) -> int:
    return config.kwargs["BLOCK_M"] * config.kwargs["BLOCK_N"]


def programs(config: Config, batch: int, m: int, n: int) -> int:
    blocks = config.kwargs
    return batch * -(-m // blocks["BLOCK_M"]) * -(-n // blocks["BLOCK_N"])


def _first_guess(configs: list[Config], batch: int, m: int, n: int, min_programs: int) -> Config:
    for config in configs:
        if programs(config, batch, m, n) >= min_programs:
            return config
    return max(configs, key=lambda c: programs(c, batch, m, n))
