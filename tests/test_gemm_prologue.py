"""Prologue fusion in the GEMM template (config.gemm_prologue_fusion): a pointwise producer
of a matmul operand that only the matmul reads (a cast, a scale) computed in the
template's operand load, per k-step, instead of written to memory and read back.

Columns as in test_gemm_template.py: the template runs on triton-interpret (small shapes;
bfloat16 matmuls fall back there) and cuda; the cpu column keeps matmuls on aten, and
every test still compares with eager there.
"""
import logging

import pytest
import torch
import torch.nn.functional as F

import autotune_cache
from tritonfuse import config, metrics
from tritonfuse.codegen.triton import gemm_choice

from common import check, rand
from test_gemm_template import has_template, max_autotune, measured, shape, template_kernels, tol  # noqa: F401


@pytest.fixture(autouse=True)
def prologues_on(monkeypatch):
    monkeypatch.setattr(config, "gemm_prologue_fusion", "cheap")


def template_source(sources):
    (kernel,) = [s for s in sources[1:] if "tl.dot(" in s]
    return kernel


def assert_fused(device, sources, kernels=1, prologues="a", dtype=torch.float32):
    """One template kernel computing the operands ``prologues`` in its loads, ``kernels``
    kernels in all; where the column has no template, the matmul fell back."""
    if not has_template(device, dtype):
        assert template_kernels() == [] and any(name.startswith("aten.") for name in metrics.fallbacks)
        return
    assert len(template_kernels()) == 1 and metrics.generated_kernel_count == kernels, metrics.generated_kernels
    kernel = template_source(sources)
    for which in "ab":
        assert (f"{which} = tl." in kernel and f"{which}_tmp0" in kernel) == (which in prologues), kernel
        assert (f"{which}_ptrs" in kernel) == (which not in prologues), kernel


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cast_prologue(device, dtype, monkeypatch):
    """float32 weights (and activations) cast to a half dtype for the matmul: the casts run
    in the template's loads (the half operand never reaches memory) under "all"; "cheap"
    keeps casts that read wider elements than they write out of the template (2.6x slower
    on an H100)."""
    m, k, n = shape(device)
    x, w = rand(m, k, device=device, low=-1, high=1), rand(k, n, device=device, low=-1, high=1)
    # to the half dtype and back, for a float32 matmul (every column has one); like
    # Inductor, a kernel may skip the rounding between two casts
    sources = check(lambda x, w: x @ w.to(dtype).float(), x, w, **tol(dtype, k))
    assert_fused(device, sources, prologues="b")
    torch._dynamo.reset()
    metrics.reset()
    sources = check(lambda x, w: x.to(dtype) @ w.to(dtype), x, w, **tol(dtype, k))
    if has_template(device, dtype):
        kernel = template_source(sources)
        assert "a_ptrs" in kernel and "b_ptrs" in kernel, kernel     # "cheap": no widening prologue
    torch._dynamo.reset()
    metrics.reset()
    monkeypatch.setattr(config, "gemm_prologue_fusion", "all")
    sources = check(lambda x, w: x.to(dtype) @ w.to(dtype), x, w, **tol(dtype, k))
    assert_fused(device, sources, prologues="ab", dtype=dtype)
    if has_template(device, dtype):
        assert f".to({'tl.float16' if dtype == torch.float16 else 'tl.bfloat16'})" in template_source(sources)


@pytest.mark.parametrize("operand", ["a", "b"])
def test_scale_prologue(device, operand):
    """A scale of one operand by a broadcast vector (per row of a, per column of b)."""
    m, k, n = shape(device)
    x, w = rand(m, k, device=device), rand(k, n, device=device)
    if operand == "a":
        s = rand(m, 1, device=device)
        sources = check(lambda x, w, s: (x * s) @ w, x, w, s, **tol(torch.float32, k))
    else:
        s = rand(n, device=device)
        sources = check(lambda x, w, s: x @ (w * s - 1.0), x, w, s, **tol(torch.float32, k))
    assert_fused(device, sources, prologues=operand)


def test_transposed_operands_with_prologues(device):
    """Producers whose buffers the template reads transposed (x^T stored, w stored [n, k])."""
    m, k, n = shape(device)
    # wt holds float16 values: the round trip through float16, which a kernel may skip (as
    # Inductor's), changes nothing, so float32 tolerances hold at the cuda column's sizes
    xt, wt = rand(k, m, device=device), rand(n, k, device=device).half().float()
    sources = check(lambda xt, wt: (xt * 2).t() @ (wt.to(torch.float16).float()).t(), xt, wt, **tol(torch.float32, k))
    assert_fused(device, sources, prologues="ab")


def test_bmm_with_prologue(device):
    m, k, n = shape(device)
    a, b = rand(3, m // 4, k, device=device), rand(3, n // 4, k, device=device)
    sources = check(lambda a, b: torch.bmm(a * 0.5, b.transpose(1, 2)), a, b, **tol(torch.float32, k))
    assert_fused(device, sources, prologues="a")


def test_addmm_with_prologue(device):
    """An addmm (its bias in the store) of a scaled input."""
    m, k, n = shape(device)
    c, x, w = rand(n, device=device), rand(m, k, device=device), rand(k, n, device=device)
    sources = check(lambda c, x, w: torch.addmm(c, x * 3, w, beta=0.5), c, x, w, **tol(torch.float32, k))
    assert_fused(device, sources, prologues="a")


def test_prologue_and_epilogue_together(device):
    """gelu((x * 2) @ (w * 0.5) + b): both operands computed in the loads, bias and GELU in
    the store: one kernel."""
    m, k, n = shape(device)
    x, w, b = rand(m, k, device=device), rand(k, n, device=device), rand(n, device=device)
    sources = check(lambda x, w, b: F.gelu((x * 2) @ (w * 0.5) + b), x, w, b, **tol(torch.float32, k))
    assert_fused(device, sources, prologues="ab")
    if has_template(device):
        assert "erf" in template_source(sources)


def test_producer_read_twice_is_not_fused(device):
    """A producer that another kernel reads too (or that is an output) is stored once, as
    without prologues; its matmul loads it."""
    m, k, n = shape(device)
    x, w = rand(m, k, device=device), rand(k, n, device=device)
    sources = check(lambda x, w: (lambda y: (y @ w, y.sum(1)))(x * 2), x, w, **tol(torch.float32, k))
    if has_template(device):     # the template, and y with its sum
        assert "a_tmp0" not in template_source(sources) and metrics.generated_kernel_count == 2
    torch._dynamo.reset()
    metrics.reset()
    sources = check(lambda x, w: (lambda y: (y @ w, y))(x * 2), x, w, **tol(torch.float32, k))
    if has_template(device):
        assert "a_tmp0" not in template_source(sources) and metrics.generated_kernel_count == 2


def test_sliced_operand_is_not_fused(device):
    """A producer the matmul reads only part of (a slice: no one-to-one view) keeps its kernel."""
    m, k, n = shape(device)
    x, w = rand(m, k + 5, device=device), rand(k, n, device=device)
    sources = check(lambda x, w: (x * 2)[:, 5:] @ w, x, w, **tol(torch.float32, k))
    if has_template(device):
        assert "a_tmp0" not in template_source(sources) and metrics.generated_kernel_count == 2


def test_option_off_and_op_cost(device, monkeypatch):
    """Off: the producer is its own kernel, as before. "cheap" leaves a transcendental
    producer outside (the k loop repeats it per tile column); "all" fuses it."""
    m, k, n = shape(device)
    x, w = rand(m, k, device=device, low=-1, high=1), rand(k, n, device=device)
    for mode, fn, fused in [("off", lambda x, w: (x * 2) @ w, False),
                            ("cheap", lambda x, w: torch.exp(x) @ w, False),
                            ("all", lambda x, w: torch.exp(x) @ w, True)]:
        torch._dynamo.reset()
        metrics.reset()
        monkeypatch.setattr(config, "gemm_prologue_fusion", mode)
        sources = check(fn, x, w, **tol(torch.float32, k))
        if has_template(device):
            assert ("a_tmp0" in template_source(sources)) == fused
            assert metrics.generated_kernel_count == (1 if fused else 2), (mode, metrics.generated_kernels)


# ---- the choice: the fused kernel timed against its producers' kernels plus the matmul ----

def timed_prologues(monkeypatch, fused_ms, producer_ms):
    """The prologue choice times its kernels as ``fused_ms`` (the template computing the
    prologues) and ``producer_ms`` (each producer's own kernel); returns the list of the
    kernel runs it was given, one list per choice."""
    calls = []

    def time_runs(self, runs, buffers, device):
        calls.append(runs)
        for run in runs:      # every buffer a run takes is described
            assert set(run.buffers) - {gemm_choice.ZERO_DIVISION} <= set(buffers), (run.buffers, buffers)
        return [fused_ms] + [producer_ms] * (len(runs) - 1)
    monkeypatch.setattr(gemm_choice.MatmulChoice, "_time_runs", time_runs)
    return calls


def prologue_case(device, monkeypatch, cache_dir, fused_ms, producer_ms, template_ms=1.0):
    """(x, w, k, the choice's kernel runs) for a matmul of [m, k] @ [k, n] whose choice saw
    template_ms against aten's 0.7 ms (an elementwise pass 0.5) and times its prologue
    kernels as timed_prologues does; skipped where the column has no template."""
    if not has_template(device):
        pytest.skip("no GEMM template on this column")
    m, k, n = shape(device)
    measured(monkeypatch, cache_dir, template_ms=template_ms, aten_ms=0.7, round_trip_ms=0.5)
    calls = timed_prologues(monkeypatch, fused_ms=fused_ms, producer_ms=producer_ms)
    return rand(m, k, device=device), rand(k, n, device=device), k, calls


def test_choice_times_the_fused_kernel(device, monkeypatch, tmp_path, caplog):
    """The template (1.0 ms) is slower than aten (0.7 ms); the template computing x * 2 in
    its loads (0.8 ms) beats the producer's kernel (0.2 ms) plus aten: it runs, one kernel.
    What the choice timed is that template (its prologue, its config) and the producer's
    own kernel."""
    x, w, k, calls = prologue_case(device, monkeypatch, tmp_path, fused_ms=0.8, producer_ms=0.2)
    with caplog.at_level(logging.INFO, logger="tritonfuse"):
        sources = check(lambda x, w: (x * 2) @ w, x, w, **tol(torch.float32, k))
    assert_fused(device, sources, prologues="a")
    (runs,) = calls
    fused, producer = runs
    assert fused.kind == "template" and fused.name == gemm_choice.PROLOGUE_KERNEL_NAME
    assert "tl.dot(" in fused.source and "a_tmp0" in fused.source and "a_ptrs" not in fused.source
    (config_used,) = fused.configs      # the config the graph's template kernel launches with
    assert f"Config.from_dict({config_used.to_dict()!r})" in sources[0], sources[0]
    assert producer.kind.startswith("pointwise") and "tl.dot(" not in producer.source and "* 2.0" in producer.source
    assert "prologue fused: the template computing it in its loads 0.8000 ms against its producers' kernels " \
           "0.2000 ms + the matmul without it 0.7000 ms" in caplog.text


@pytest.mark.parametrize("faster", ["aten", "template"])
def test_losing_prologue_is_unfused(device, monkeypatch, tmp_path, faster):
    """The template computing x * 2 (1.5 ms) loses to the producer's kernel (0.2 ms) plus
    the matmul: the producer runs as its own kernel, and the matmul is chosen as without a
    prologue: aten where it is faster (0.7 ms against the template's 1.0), the template
    loading the producer's output where that is (0.6 against 0.7)."""
    x, w, k, calls = prologue_case(device, monkeypatch, tmp_path, fused_ms=1.5, producer_ms=0.2,
                                   template_ms=1.0 if faster == "aten" else 0.6)
    sources = check(lambda x, w: (x * 2) @ w, x, w, **tol(torch.float32, k))
    assert len(calls) == 1
    if faster == "aten":
        assert template_kernels() == [] and metrics.generated_kernel_count == 1
        assert "aten was faster" in metrics.fallbacks["aten.mm.default"] and "torch.mm(" in sources[0]
    else:
        assert len(template_kernels()) == 1 and metrics.generated_kernel_count == 2
        kernel = template_source(sources)
        assert "a_tmp0" not in kernel and "a_ptrs" in kernel, kernel


def test_losing_prologues_with_an_epilogue(device, monkeypatch, tmp_path):
    """Both operands' producers (0.3 ms each) plus the matmul with its GELU (aten 0.7 and an
    epilogue kernel 0.5, against the template's 1.0) beat the fused template (1.7 ms): two
    producer kernels, then the template with GELU in its store. At 1.5 ms the fused
    template wins: one kernel. Results as eager both times."""
    x, w, k, calls = prologue_case(device, monkeypatch, tmp_path / "one", fused_ms=1.7, producer_ms=0.3)
    sources = check(lambda x, w: F.gelu((x * 2) @ (w * 0.5)), x, w, **tol(torch.float32, k))
    (runs,) = calls
    assert len(runs) == 3      # the fused template, then each producer's kernel
    assert len(template_kernels()) == 1 and metrics.generated_kernel_count == 3
    kernel = template_source(sources)
    assert "a_ptrs" in kernel and "b_ptrs" in kernel and "erf" in kernel, kernel
    torch._dynamo.reset()
    metrics.reset()
    # 1.5 ms against 2 * 0.3 + 1.0 (the template, faster than aten's 0.7 plus the GELU kernel's 0.5)
    prologue_case(device, monkeypatch, tmp_path / "two", fused_ms=1.5, producer_ms=0.3)
    sources = check(lambda x, w: F.gelu((x * 2) @ (w * 0.5)), x, w, **tol(torch.float32, k))
    assert_fused(device, sources, prologues="ab")


def test_prologue_decision_is_cached(device, monkeypatch, tmp_path, caplog):
    """The decision and its times are stored in the autotune cache, keyed by the prologue:
    a second compile of the same graph times nothing and decides the same; another
    prologue on the same matmul is timed anew."""
    x, w, k, calls = prologue_case(device, monkeypatch, tmp_path, fused_ms=1.5, producer_ms=0.2)
    check(lambda x, w: (x * 2) @ w, x, w, **tol(torch.float32, k))
    assert len(calls) == 1 and template_kernels() == []
    (entry,) = [e for e in autotune_cache.AutotuneCache().entries() if e.get("kind") == "gemm prologue"]
    assert entry["prologue"] == "unfused"
    assert entry["timings_ms"] == {gemm_choice.FUSED: 1.5, gemm_choice.PRODUCERS: 0.2, gemm_choice.MATMUL: 0.7}

    def must_not_time(self, runs, buffers, device):
        raise AssertionError("timed again")
    monkeypatch.setattr(gemm_choice.MatmulChoice, "_time_runs", must_not_time)
    for _ in range(2):     # the matmul's choice and its prologue's, both from the cache
        torch._dynamo.reset()
        metrics.reset()
        with caplog.at_level(logging.INFO, logger="tritonfuse"):
            check(lambda x, w: (x * 2) @ w, x, w, **tol(torch.float32, k))
        assert template_kernels() == [] and metrics.generated_kernel_count == 1
        assert "prologue unfused" in caplog.text and "from the autotune cache" in caplog.text
    torch._dynamo.reset()
    metrics.reset()
    calls = timed_prologues(monkeypatch, fused_ms=0.1, producer_ms=0.2)
    sources = check(lambda x, w: (x * 3 + 1) @ w, x, w, **tol(torch.float32, k))
    assert len(calls) == 1
    assert_fused(device, sources, prologues="a")


def test_choice_runs_the_real_kernels(device, monkeypatch, tmp_path):
    """Nothing faked but the matmul's own timings: the fused template and the producers'
    kernels run (under the interpreter here), once each, and whichever way the choice
    goes, the results equal eager."""
    if not has_template(device):
        pytest.skip("no GEMM template on this column")
    m, k, n = shape(device)
    # w holds float16 values: the round trip through float16, which a kernel may skip, is exact
    x, w = rand(m, k, device=device), rand(k, n, device=device).to(torch.float16).float()
    measured(monkeypatch, tmp_path, template_ms=1.0, aten_ms=0.7, round_trip_ms=0.5)
    timed = []
    real = gemm_choice.MatmulChoice._time_runs

    def time_runs(self, runs, buffers, device):
        times = real(self, runs, buffers, device)
        timed.append(([run.name for run in runs], times))
        return times
    monkeypatch.setattr(gemm_choice.MatmulChoice, "_time_runs", time_runs)
    check(lambda x, w: (x * 2) @ (w.to(torch.float16).float()), x, w, **tol(torch.float32, k))
    ((names, times),) = timed
    assert names == [gemm_choice.PROLOGUE_KERNEL_NAME] + \
        [f"{gemm_choice.PROLOGUE_KERNEL_NAME}_producer{i}" for i in range(2)], names
    assert times is not None and all(ms > 0 for ms in times), times
    assert metrics.generated_kernel_count in (1, 2, 3)


def test_prologue_that_fails_to_run_is_unfused(device, monkeypatch, tmp_path, caplog):
    """A kernel of the choice that fails to run (a compile error, too much shared memory):
    the producer runs as its own kernel, nothing is cached, and the results equal eager."""
    if not has_template(device):
        pytest.skip("no GEMM template on this column")
    from tritonfuse.runtime import autotuner
    m, k, n = shape(device)
    x, w = rand(m, k, device=device), rand(k, n, device=device)
    measured(monkeypatch, tmp_path, template_ms=0.5, aten_ms=0.7, round_trip_ms=0.5)

    def fails(fn, *args, **kwargs):
        raise RuntimeError("out of resources")
    monkeypatch.setattr(autotuner, "benchmark", fails)
    with caplog.at_level(logging.INFO, logger="tritonfuse"):
        sources = check(lambda x, w: (x * 2) @ w, x, w, **tol(torch.float32, k))
    assert "prologue unfused: a kernel of the choice failed to run" in caplog.text
    assert len(template_kernels()) == 1 and metrics.generated_kernel_count == 2
    assert "a_ptrs" in template_source(sources)
    assert not [e for e in autotune_cache.AutotuneCache().entries() if e.get("kind") == "gemm prologue"]


def test_prologue_pipeline_fits_shared_memory(device, monkeypatch):
    """The producer's inputs are staged in shared memory at their own width: where the
    chosen tile's pipeline would not fit, its stages are cut down, and where not even two
    fit, the producer runs as its own kernel and the template loads its output."""
    from tritonfuse.codegen.triton import gemm_prologue
    m, k, n = shape(device)
    x, w = rand(m, k, device=device), rand(k, n, device=device)
    for limit, fused in [(2**30, True), (1, False)]:     # bytes of shared memory
        torch._dynamo.reset()
        metrics.reset()
        real = gemm_prologue.prologue_config
        monkeypatch.setattr("tritonfuse.codegen.triton.gemm_template.prologue_config",
                            lambda group, graph, shared: real(group, graph, limit))
        sources = check(lambda x, w: (x * 2) @ w, x, w, **tol(torch.float32, k))
        if has_template(device):
            assert ("a_tmp0" in template_source(sources)) == fused
            assert metrics.generated_kernel_count == (1 if fused else 2)


def test_option_is_part_of_the_graph_cache_key(device, monkeypatch):
    """A graph compiled with prologues off is not what the cache serves with them on."""
    if not has_template(device):
        pytest.skip("no GEMM template on this column")
    monkeypatch.setattr(config, "graph_cache", True)
    m, k, n = shape(device)
    x, w = rand(m, k, device=device), rand(k, n, device=device)
    for mode in ["off", "cheap", "off"]:       # the second "off" from the cache
        torch._dynamo.reset()
        metrics.reset()
        monkeypatch.setattr(config, "gemm_prologue_fusion", mode)
        sources = check(lambda x, w: (x * 2) @ w + 0.25, x, w, **tol(torch.float32, k))
        assert ("a_tmp0" in "".join(sources)) == (mode == "cheap"), mode
