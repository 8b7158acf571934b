"""Candidate launch configs: shapes of the lists and the invariants every config keeps."""
import pytest

from tritonfuse.runtime.heuristics import (
    MAX_GRID_YZ,
    PERSISTENT_MAX_BLOCK_ELEMENTS,
    PERSISTENT_REDUCTION_MAX_RBLOCK,
    POINTWISE_MAX_BLOCK_ELEMENTS,
    REDUCTION_MAX_BLOCK_ELEMENTS,
    Config,
    candidate_configs,
    is_persistent_reduction_ok,
    next_power_of_2,
)

DIM_OF_BLOCK = {"XBLOCK": "x", "YBLOCK": "y", "RBLOCK": "r"}

CASES = [
    ("pointwise", {"x": 1}),
    ("pointwise", {"x": 17}),
    ("pointwise", {"x": 4096}),
    ("pointwise", {"x": 50_000}),       # x // 128 = 390 and 768 (inference of 1 x 128 x 768):
    ("pointwise", {"x": 98_304}),       # the first guess must still be a power of two
    ("pointwise", {"x": 10_000_000}),
    ("pointwise_2d", {"y": 1024, "x": 768}),
    ("pointwise_2d", {"y": 3, "x": 50_000}),
    ("pointwise_2d", {"y": 50_000_000, "x": 2}),
    ("reduction", {"x": 8, "r": 100_000}),
    ("reduction", {"x": 4096, "r": 4096}),
    ("reduction", {"x": 100, "r": 37}),
    ("reduction", {"x": 1, "r": 3}),
    ("persistent_reduction", {"x": 4096, "r": 768}),
    ("persistent_reduction", {"x": 4096, "r": 64}),
    ("persistent_reduction", {"x": 3, "r": 8}),
    ("persistent_reduction", {"x": 1, "r": 1}),
]
CAPS = {
    "pointwise": POINTWISE_MAX_BLOCK_ELEMENTS,
    "pointwise_2d": POINTWISE_MAX_BLOCK_ELEMENTS,
    "reduction": REDUCTION_MAX_BLOCK_ELEMENTS,
    "persistent_reduction": PERSISTENT_MAX_BLOCK_ELEMENTS,
}


def is_pow2(n):
    return n >= 1 and n & (n - 1) == 0


@pytest.mark.parametrize("kind,numels", CASES)
@pytest.mark.parametrize("mode", ["none", "default", "max"])
def test_configs_are_powers_of_two_and_bounded(kind, numels, mode):
    configs = candidate_configs(kind, numels, mode)
    assert configs and len(set(configs)) == len(configs)
    for cfg in configs:
        assert set(cfg.kwargs) == {b for b, d in DIM_OF_BLOCK.items() if d in numels}
        product = 1
        for block, size in cfg.kwargs.items():
            assert is_pow2(size), cfg
            assert size <= next_power_of_2(numels[DIM_OF_BLOCK[block]]), cfg
            product *= size
        if not (kind == "persistent_reduction" and product == cfg.kwargs["RBLOCK"]):
            assert product <= CAPS[kind], cfg
        assert is_pow2(cfg.num_warps) and 1 <= cfg.num_warps <= 16, cfg
        assert cfg.num_warps * 32 <= max(32, product), cfg  # no idle threads
        assert cfg.num_stages in (1, 2, 3)
        if kind == "persistent_reduction":
            assert cfg.kwargs["RBLOCK"] == next_power_of_2(numels["r"])
        if kind == "pointwise_2d":
            assert -(-numels["y"] // cfg.kwargs["YBLOCK"]) <= MAX_GRID_YZ


@pytest.mark.parametrize("kind,numels", CASES)
def test_modes_nest(kind, numels):
    none = candidate_configs(kind, numels, "none")
    default = candidate_configs(kind, numels, "default")
    most = candidate_configs(kind, numels, "max")
    assert len(none) == 1
    assert none[0] == default[0] == most[0]
    assert len(most) >= len(default) >= 1
    assert set(default) <= set(most)


def test_default_offers_choices_for_real_sizes():
    # 1-D pointwise kernels are not tuned by default (their alternatives measured within
    # 1.08x of the guess); "max" still searches them
    assert len(candidate_configs("pointwise", {"x": 1 << 20}, "default")) == 1
    assert len(candidate_configs("pointwise", {"x": 1 << 20}, "max")) >= 3
    assert len(candidate_configs("pointwise_2d", {"y": 768, "x": 4096}, "default")) >= 3
    assert len(candidate_configs("reduction", {"x": 3072, "r": 1024}, "default", hint="outer")) >= 3
    assert len(candidate_configs("reduction", {"x": 4096, "r": 4096}, "default")) >= 3
    assert len(candidate_configs("persistent_reduction", {"x": 4096, "r": 256}, "default")) >= 3
    assert len(candidate_configs("reduction", {"x": 4096, "r": 4096}, "max")) > 10


def test_inner_reduction_reads_long_rows_outer_tiles_x():
    inner = candidate_configs("reduction", {"x": 4096, "r": 32768}, "none")[0]
    assert inner.kwargs["XBLOCK"] == 1 and inner.kwargs["RBLOCK"] >= 1024
    # Outer: whole 16-byte runs of x per program, and programs enough to fill an H200's
    # 132 SMs twice over (one per 512 x)
    for x in (3072, 4096, 12288):
        outer = candidate_configs("reduction", {"x": x, "r": 32768}, "none", hint="outer")[0]
        assert outer.kwargs["XBLOCK"] >= 8 and x // outer.kwargs["XBLOCK"] >= 2 * 132
    # Short rows: several rows per program.
    short = candidate_configs("reduction", {"x": 4096, "r": 40}, "none")[0]
    assert short.kwargs["XBLOCK"] > 1


def test_persistent_reduction_packs_short_rows():
    long_rows = candidate_configs("persistent_reduction", {"x": 8192, "r": 1000}, "none")[0]
    assert long_rows.kwargs == {"XBLOCK": 4, "RBLOCK": 1024}
    short_rows = candidate_configs("persistent_reduction", {"x": 8192, "r": 50}, "none")[0]
    assert short_rows.kwargs["RBLOCK"] == 64 and short_rows.kwargs["XBLOCK"] >= 8
    few_rows = candidate_configs("persistent_reduction", {"x": 128, "r": 1000}, "none")[0]
    assert few_rows.kwargs["XBLOCK"] == 1                       # keep the SMs busy
    huge_rows = candidate_configs("persistent_reduction", {"x": 8192, "r": 8000}, "default")
    assert all(c.kwargs == {"XBLOCK": 1, "RBLOCK": 8192} for c in huge_rows)


def test_pointwise_block_and_warps_scale_with_numel():
    big = candidate_configs("pointwise", {"x": 1 << 24}, "none")[0]
    small = candidate_configs("pointwise", {"x": 100}, "none")[0]
    assert big.kwargs["XBLOCK"] == 1024 and big.num_warps == 4
    assert small.kwargs["XBLOCK"] == 128 and small.num_warps <= 4


def test_transpose_tiles_are_square_by_default():
    cfg = candidate_configs("pointwise_2d", {"y": 4096, "x": 4096}, "none")[0]
    assert cfg.kwargs["YBLOCK"] == cfg.kwargs["XBLOCK"] >= 16


def test_is_persistent_reduction_ok():
    assert is_persistent_reduction_ok({"x": 10, "r": PERSISTENT_REDUCTION_MAX_RBLOCK})
    assert is_persistent_reduction_ok({"x": 10, "r": 1000})
    assert not is_persistent_reduction_ok({"x": 10, "r": PERSISTENT_REDUCTION_MAX_RBLOCK + 1})
    # an outer reduction must keep wide x tiles (coalesced loads): long r is looped instead
    assert is_persistent_reduction_ok({"x": 65536, "r": 64}, hint="outer")
    assert not is_persistent_reduction_ok({"x": 65536, "r": 512}, hint="outer")
    assert is_persistent_reduction_ok({"x": 65536, "r": 512}, hint="inner")


def test_config_roundtrip_str_and_hash():
    cfg = Config({"XBLOCK": 8, "RBLOCK": 128}, num_warps=4, num_stages=2)
    assert Config.from_dict(cfg.to_dict()) == cfg
    assert hash(Config.from_dict(cfg.to_dict())) == hash(cfg)
    assert str(cfg) == "XBLOCK=8, RBLOCK=128, num_warps=4, num_stages=2"
    assert Config.from_dict({"kwargs": {"XBLOCK": 4}, "num_warps": 1}).num_stages == 1
    with pytest.raises((KeyError, TypeError, ValueError)):
        Config.from_dict({"kwargs": [1], "num_warps": 1})


def test_bad_kind_or_mode():
    with pytest.raises(ValueError):
        candidate_configs("matmul", {"x": 4}, "none")
    with pytest.raises(ValueError):
        candidate_configs("pointwise", {"x": 4}, "fast")
