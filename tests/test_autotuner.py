"""select_best / benchmark with fake timers and fake launches (no kernels here)."""
import logging

import pytest
import torch

from tritonfuse.runtime import autotuner
from tritonfuse.runtime.autotuner import AutotuneError, benchmark, select_best
from tritonfuse.runtime.heuristics import Config

CONFIGS = [Config({"XBLOCK": b}, num_warps=w) for b, w in ((64, 1), (256, 2), (1024, 4))]


class FakeTimer:
    """Times a launch by the config it ran: each config has a fixed made-up cost."""

    def __init__(self, cost_by_block):
        self.cost_by_block = cost_by_block
        self.last = None
        self.calls = 0

    def __call__(self, fn):
        fn()
        self.calls += 1
        return self.cost_by_block[self.last.kwargs["XBLOCK"]]


@pytest.fixture(autouse=True)
def fresh_stats():
    autotuner.stats.reset()
    yield
    autotuner.stats.reset()


def test_select_best_picks_the_fastest():
    timer = FakeTimer({64: 3.0, 256: 0.5, 1024: 1.0})

    def launch(cfg):
        timer.last = cfg

    best, timings = select_best(CONFIGS, launch, [], [], timer=timer)
    assert best == CONFIGS[1]
    assert timings == {str(CONFIGS[0]): 3.0, str(CONFIGS[1]): 0.5, str(CONFIGS[2]): 1.0}
    assert timer.calls == 3
    assert autotuner.stats.tuned == 1 and autotuner.stats.tuning_seconds > 0


def test_failing_candidate_is_skipped_with_one_log_line(caplog):
    timer = FakeTimer({64: 0.1, 256: 2.0, 1024: 1.0})

    def launch(cfg):
        if cfg.kwargs["XBLOCK"] == 64:
            raise RuntimeError("out of resources: shared memory\nlong details")
        timer.last = cfg

    with caplog.at_level(logging.INFO, logger="tritonfuse.autotune"):
        best, timings = select_best(CONFIGS, launch, [], [], timer=timer, name="k0")
    assert best == CONFIGS[2]
    assert str(CONFIGS[0]) not in timings
    skipped = [r for r in caplog.records if "skipping" in r.getMessage()]
    assert len(skipped) == 1
    assert "k0" in skipped[0].getMessage() and "out of resources" in skipped[0].getMessage()


def test_all_failing_raises_a_clear_error():
    def launch(cfg):
        raise ValueError(f"bad {cfg.kwargs['XBLOCK']}")

    with pytest.raises(AutotuneError, match="all 3 candidate configs failed") as info:
        select_best(CONFIGS, launch, [], [], timer=lambda fn: fn() or 1.0, name="k1")
    assert "bad 64" in str(info.value) and "bad 1024" in str(info.value)
    assert autotuner.stats.tuned == 0


def test_mutated_arguments_are_restored():
    out = torch.arange(6, dtype=torch.float32)
    acc = torch.ones(3, dtype=torch.int64)
    original_out, original_acc = out.clone(), acc.clone()
    seen_at_start = []

    def launch(cfg):
        seen_at_start.append(out.clone())
        out.add_(cfg.kwargs["XBLOCK"])       # an accumulating kernel
        acc.mul_(2)

    def timer(fn):
        for _ in range(5):                  # benchmarking launches many times
            fn()
        return 1.0

    select_best(CONFIGS, launch, [torch.zeros(2), out, 7, acc], [1, 3], timer=timer)
    assert torch.equal(out, original_out)
    assert torch.equal(acc, original_acc)
    # Every candidate started from the original contents.
    assert torch.equal(seen_at_start[0], original_out)
    assert torch.equal(seen_at_start[5], original_out)
    assert torch.equal(seen_at_start[10], original_out)


def test_mutated_arguments_restored_even_if_tuning_fails():
    out = torch.zeros(4)

    def launch(cfg):
        out.add_(1)
        raise RuntimeError("compile error")

    with pytest.raises(AutotuneError):
        select_best(CONFIGS, launch, [out], [0], timer=lambda fn: fn())
    assert torch.equal(out, torch.zeros(4))


def test_benchmark_uses_the_injected_timer_or_a_cpu_loop():
    calls = []
    assert benchmark(lambda: calls.append(1), timer=lambda fn: 4.5) == 4.5
    assert calls == []
    ms = benchmark(lambda: calls.append(1), device_type="cpu")
    assert isinstance(ms, float) and ms >= 0
    assert 2 <= len(calls) <= autotuner.CPU_BENCH_MAX_REPS + 1


def test_empty_candidates_rejected():
    with pytest.raises(ValueError):
        select_best([], lambda cfg: None, [], [])
