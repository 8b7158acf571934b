"""The GEMM template (mode="max-autotune"): mm, addmm and bmm as Triton kernels, with their
pointwise consumers fused into the template's store.

Every test runs on each column of the device matrix:
  cpu               the C++ backend has no GEMM template: matmuls stay aten calls
  triton-interpret  the template under Triton's interpreter, small shapes; bfloat16 falls
                    back (the interpreter's tl.dot multiplies bfloat16 as raw integers)
  cuda              larger shapes, every dtype; the template is forced (gemm_backends
                    "triton", heuristic config) except in the test of the choice itself
"""
import pytest
import torch
import torch.nn.functional as F

import autotune_cache
import tritonfuse
from tritonfuse import config, metrics
from tritonfuse.codegen.triton import gemm_choice
from tritonfuse.runtime import autotuner
from tritonfuse.testing import run_and_get_code

from common import allocation_count, assert_same, check, rand

# (M, K, N): sizes that are no multiple of any tile (and span several tiles)
SHAPES = {"cpu": (37, 29, 50), "cuda": (1000, 264, 776)}
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 4e-2}


@pytest.fixture(autouse=True)
def max_autotune(request, monkeypatch, tmp_path):
    """Every compile under max-autotune, from scratch (no graph cache; an autotune cache of
    the test's own); on cuda, the template on every matmul that it takes (nothing
    benchmarked), so that the tests test the template rather than cuBLAS."""
    monkeypatch.setattr(config, "max_autotune", True)
    monkeypatch.setattr(config, "graph_cache", False)
    monkeypatch.setattr(config, "autotune_cache_dir", str(tmp_path / "autotune"))
    if "device" in request.fixturenames and request.getfixturevalue("device") == "cuda":
        monkeypatch.setattr(config, "gemm_backends", "triton")
        monkeypatch.setattr(config, "autotune", "none")


def has_template(device, dtype=torch.float32) -> bool:
    """Whether matmuls of ``dtype`` on this column become GEMM template kernels."""
    if device == "cuda":
        return True
    return config.cpu_backend == "triton" and dtype != torch.bfloat16


def shape(device):
    return SHAPES["cuda" if device == "cuda" else "cpu"]


def tol(dtype, k=64):
    """fp32 sums of k products in another order (TF32 off); low precision: the output's ulp."""
    value = TOLERANCE[dtype] * (1 if dtype != torch.float32 else max(1, k // 64))
    return dict(atol=value, rtol=value)


def template_kernels():
    return [name for name in metrics.generated_kernels if name.startswith("triton_tem")]


def assert_matmuls(device, dtype, count, op="aten.mm.default"):
    """``count`` template kernels here; or, where the column has no template, ``op`` fell back."""
    if has_template(device, dtype):
        assert len(template_kernels()) == count, metrics.generated_kernels
        assert not any(name.startswith(("aten.mm", "aten.bmm", "aten.addmm")) for name in metrics.fallbacks), \
            metrics.fallbacks
    else:
        assert template_kernels() == []
        assert op in metrics.fallbacks, metrics.fallbacks


# ---- the template on its own ----------------------------------------------------------

@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
def test_mm_any_shape_and_transposed_operands(device, layout):
    m, k, n = shape(device)
    a = rand(k, m, device=device).t() if layout[0] == "t" else rand(m, k, device=device)
    b = rand(n, k, device=device).t() if layout[1] == "t" else rand(k, n, device=device)
    check(lambda a, b: a @ b, a, b, **tol(torch.float32, k))
    assert_matmuls(device, torch.float32, 1)


def test_mm_of_views_with_offsets(device):
    """Operands that are slices of bigger buffers (an offset, a row stride past the width)."""
    m, k, n = shape(device)
    a, b = rand(m + 3, k + 7, device=device), rand(k, n, device=device)
    check(lambda a, b: a[3:, 5:5 + k] @ b, a, b, **tol(torch.float32, k))
    assert_matmuls(device, torch.float32, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_dtypes(device, dtype):
    m, k, n = shape(device)
    a, b = rand(m, k, dtype=dtype, device=device, low=-1, high=1), rand(k, n, dtype=dtype, device=device, low=-1, high=1)
    check(lambda a, b: a @ b, a, b, **tol(dtype, k))
    assert_matmuls(device, dtype, 1)


def test_bmm_and_batched_matmul(device):
    m, k, n = shape(device)
    a, b = rand(3, m // 4, k, device=device), rand(3, k, n // 4, device=device)
    check(lambda a, b: torch.bmm(a, b), a, b, **tol(torch.float32, k))
    assert_matmuls(device, torch.float32, 1, op="aten.bmm.default")


def test_attention_scores_transposed_batched(device):
    """q @ k^T over (batch, heads): a bmm of a transposed view, then a softmax."""
    q, key = rand(2, 3, 40, 16, device=device), rand(2, 3, 24, 16, device=device)
    check(lambda q, key: torch.softmax(q @ key.transpose(-2, -1) * 0.25, dim=-1), q, key)
    assert_matmuls(device, torch.float32, 1, op="aten.bmm.default")


# ---- epilogues --------------------------------------------------------------------------

def test_gelu_of_linear_is_one_kernel(device):
    """gelu(x @ w + b): bias and activation in the template's store; nothing else runs."""
    m, k, n = shape(device)
    x, w, b = rand(m, k, device=device), rand(k, n, device=device), rand(n, device=device)
    sources = check(lambda x, w, b: F.gelu(x @ w + b), x, w, b, **tol(torch.float32, k))
    if has_template(device):
        assert metrics.generated_kernel_count == 1, metrics.generated_kernels
        kernel = sources[1]
        assert "tl.dot(" in kernel and "erf" in kernel and kernel.count("tl.store(") == 1
        assert allocation_count(sources[0]) == 1      # the output; the product never reaches memory
    else:
        assert "aten.mm.default" in metrics.fallbacks


def test_residual_and_cast_epilogues(device):
    m, k, n = shape(device)
    x, w, r = rand(m, k, device=device), rand(k, n, device=device), rand(m, n, device=device)
    check(lambda x, w, r: x @ w + r, x, w, r, **tol(torch.float32, k))
    assert_matmuls(device, torch.float32, 1)
    if has_template(device):
        assert metrics.generated_kernel_count == 1
    metrics.reset()
    torch._dynamo.reset()
    check(lambda x, w: (x @ w).to(torch.bfloat16), x, w, **tol(torch.bfloat16))
    assert_matmuls(device, torch.float32, 1)
    if has_template(device):
        assert metrics.generated_kernel_count == 1


@pytest.mark.parametrize("bias_shape", ["row", "column", "full"])
def test_addmm_bias_broadcasts(device, bias_shape):
    m, k, n = shape(device)
    bias = {"row": (n,), "column": (m, 1), "full": (m, n)}[bias_shape]
    inputs = rand(*bias, device=device), rand(m, k, device=device), rand(k, n, device=device)
    check(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=2.0).relu(), *inputs, **tol(torch.float32, k))
    assert_matmuls(device, torch.float32, 1, op="aten.addmm.default")


def test_epilogue_over_a_batched_view(device):
    """A linear over (batch, seq, features): the mm's output is viewed 3-d, its consumers
    read a per-batch scale and a residual stored in another dim order."""
    batch, seq, k, n = 2, 5, 16, 24
    x, w = rand(batch * seq, k, device=device), rand(k, n, device=device)
    scale, residual = rand(batch, 1, 1, device=device), rand(seq, batch, n, device=device)
    check(lambda x, w, s, r: (x @ w).view(batch, seq, n) * s + r.permute(1, 0, 2), x, w, scale, residual)
    assert_matmuls(device, torch.float32, 1)
    if has_template(device):
        assert metrics.generated_kernel_count == 1


def test_product_and_its_consumer_both_outputs(device):
    x, w = rand(20, 16, device=device), rand(16, 17, device=device)
    check(lambda x, w: (lambda y: (y, torch.sigmoid(y) * 2))(x @ w), x, w)
    assert_matmuls(device, torch.float32, 1)
    if has_template(device):
        assert metrics.generated_kernel_count == 1


def test_reductions_and_producers_stay_outside(device, monkeypatch):
    """A reduction of the product is its own kernel; so is a pointwise producer of an
    operand where prologue fusion is off (test_gemm_prologue.py: where it is on)."""
    monkeypatch.setattr(config, "gemm_prologue_fusion", "off")
    x, w = rand(20, 16, device=device), rand(16, 17, device=device)
    check(lambda x, w: ((x * 2) @ w).sum(1), x, w)
    assert_matmuls(device, torch.float32, 1)
    if has_template(device):
        assert metrics.generated_kernel_count == 3, metrics.generated_kernels


def test_degenerate_sizes(device):
    for m, k, n in [(1, 16, 17), (20, 16, 1), (20, 1, 17)]:
        torch._dynamo.reset()
        metrics.reset()
        check(lambda a, b: (a @ b).relu(), rand(m, k, device=device), rand(k, n, device=device))
        if k == 1:   # an outer product: a broadcast mul fused with the relu, as in Inductor
            assert not metrics.fallbacks and metrics.generated_kernel_count == 1, metrics.generated_kernels
        else:
            assert_matmuls(device, torch.float32, 1)


# ---- training -----------------------------------------------------------------------------

def test_linear_layers_forward_and_backward(device):
    """Both linear layers of an MLP, forward and both backward matmuls (grad of the input,
    grad of the weight), with GELU and its backward in epilogues."""
    torch.manual_seed(0)
    m, k, n = shape(device)
    model = torch.nn.Sequential(torch.nn.Linear(k, n), torch.nn.GELU(), torch.nn.Linear(n, 19)).to(device)
    reference = torch.nn.Sequential(torch.nn.Linear(k, n), torch.nn.GELU(), torch.nn.Linear(n, 19)).to(device)
    reference.load_state_dict(model.state_dict())
    x = rand(3, m // 3, k, device=device, low=-1, high=1)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    compiled = torch.compile(model, backend="tritonfuse")
    out = compiled(x1)
    out.square().sum().backward()
    expected = reference(x2)
    expected.square().sum().backward()
    tolerance = tol(torch.float32, m)
    assert metrics.eager_graphs == 0
    assert_same(out, expected, **tolerance)
    assert_same(x1.grad, x2.grad, **tolerance)
    for p, q in zip(model.parameters(), reference.parameters()):
        assert_same(p.grad, q.grad, **tolerance)
    if has_template(device):
        # forward: 2 addmm; backward: grad input of layer 2 (with GELU's backward fused),
        # both weight grads, and no grad input of layer 1's ... input (x needs one: 3 + 1)
        assert len(template_kernels()) == 6, metrics.generated_kernels
        assert not metrics.fallbacks
    else:
        assert "aten.mm.default" in metrics.fallbacks


# ---- when the template is not used -------------------------------------------------------

def test_default_mode_keeps_aten(device, monkeypatch):
    monkeypatch.setattr(config, "max_autotune", False)
    x, w = rand(20, 16, device=device), rand(16, 17, device=device)
    check(lambda x, w: (x @ w).relu(), x, w)
    assert template_kernels() == []
    assert "max-autotune" in metrics.fallbacks["aten.mm.default"]


def test_mode_and_options_turn_it_on(device, monkeypatch):
    monkeypatch.setattr(config, "max_autotune", False)
    x, w = rand(20, 16, device=device), rand(16, 17, device=device)
    for kwargs in ({"mode": "max-autotune"}, {"mode": "max-autotune-no-cudagraphs"},
                   {"options": {"max_autotune": True}}):
        torch._dynamo.reset()
        metrics.reset()
        compiled = torch.compile(lambda x, w: (x @ w).relu(), backend="tritonfuse", **kwargs)
        assert_same(compiled(x, w), (x @ w).relu())
        assert_matmuls(device, torch.float32, 1)


def assert_symbolic_reason(device):
    """mm fell back, for its symbolic sizes where this column has a template."""
    reason = metrics.fallbacks["aten.mm.default"]
    assert "static sizes" in reason if has_template(device) else "no GEMM template" in reason


def test_symbolic_sizes_fall_back_to_aten(device):
    """The template needs static sizes: a graph compiled once for every M (dynamic=True)
    keeps the matmul on aten, its epilogue still one fused kernel, never a crash."""
    fn = torch.compile(lambda x, w, b: F.gelu(x @ w + b), backend="tritonfuse", dynamic=True)
    w, b = rand(16, 17, device=device), rand(17, device=device)
    for rows in (20, 33, 7):
        x = rand(rows, 16, device=device)
        assert_same(fn(x, w, b), F.gelu(x @ w + b), **tol(torch.float32))
    assert template_kernels() == []
    assert_symbolic_reason(device)
    assert metrics.symbolic_graphs == 1 and metrics.static_specializations == 0 and metrics.eager_graphs == 0
    assert metrics.generated_kernel_count == 1       # bias + GELU: one kernel for every M


def test_symbolic_sizes_in_training(device):
    """dynamic=True training of a linear layer under max-autotune: the forward and both
    backward matmuls of a symbolic M stay right (on aten) for every M."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.GELU(), torch.nn.Linear(24, 5)).to(device)
    reference = torch.nn.Sequential(torch.nn.Linear(16, 24), torch.nn.GELU(), torch.nn.Linear(24, 5)).to(device)
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="tritonfuse", dynamic=True)
    for rows in (12, 31):
        x = rand(rows, 16, device=device, low=-1, high=1)
        x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
        compiled(x1).square().sum().backward()
        reference(x2).square().sum().backward()
        assert_same(x1.grad, x2.grad, **tol(torch.float32))
        for p, q in zip(model.parameters(), reference.parameters()):
            assert_same(p.grad, q.grad, **tol(torch.float32))
            p.grad = q.grad = None
    assert template_kernels() == [] and metrics.eager_graphs == 0
    assert metrics.symbolic_graphs >= 2           # the forward and the backward, once each


def test_a_new_shape_recompiles_symbolically_on_aten(device):
    """Dynamo's default: the first shape compiles static (the template where this column
    has one), a second shape recompiles with a symbolic M (aten); both right."""
    fn = torch.compile(lambda x, w: (x @ w).relu(), backend="tritonfuse")
    w = rand(16, 17, device=device)
    x = rand(20, 16, device=device)
    assert_same(fn(x, w), (x @ w).relu(), **tol(torch.float32))
    assert_matmuls(device, torch.float32, 1)
    x = rand(45, 16, device=device)
    assert_same(fn(x, w), (x @ w).relu(), **tol(torch.float32))
    assert metrics.symbolic_graphs == 1 and metrics.eager_graphs == 0
    assert_symbolic_reason(device)


def test_unsupported_dtype_falls_back(device):
    x, w = rand(20, 16, dtype=torch.float64, device=device), rand(16, 17, dtype=torch.float64, device=device)
    check(lambda x, w: x @ w, x, w)
    assert template_kernels() == []
    assert "aten.mm.default" in metrics.fallbacks


# ---- the choice against aten ---------------------------------------------------------------

def test_choice_is_benchmarked_once_then_cached(device, monkeypatch):
    """Under benchmarking (real timings on cuda; the interpreter when asked), the decision is
    stored in the autotune cache: a second compile of the same matmul benchmarks nothing."""
    if not has_template(device):
        pytest.skip("no GEMM template on this column")
    monkeypatch.setattr(config, "gemm_backends", "aten,triton")
    monkeypatch.setattr(config, "autotune", "default")
    monkeypatch.setattr(config, "autotune_under_interpreter", True)
    x, w = rand(20, 16, device=device), rand(16, 17, device=device)
    autotuner.stats.reset()
    check(lambda x, w: (x @ w).relu(), x, w)          # either choice is right
    tuned = autotuner.stats.tuned                     # the choice (and the relu's configs if aten won)
    assert tuned >= 1 and autotuner.stats.cache_hits == 0
    entries = [e for e in autotune_cache.AutotuneCache().entries() if e.get("kind") == "gemm"]
    assert len(entries) == 1 and "aten" in entries[0]["timings_ms"]
    torch._dynamo.reset()
    check(lambda x, w: (x @ w).relu(), x, w)
    assert (autotuner.stats.tuned, autotuner.stats.cache_hits) == (tuned, tuned)


def measured(monkeypatch, cache_dir, template_ms, aten_ms, round_trip_ms):
    """The choice step benchmarks under the interpreter and measures these timings (kept in
    the autotune cache ``cache_dir``)."""
    monkeypatch.setattr(config, "autotune_cache_dir", str(cache_dir))
    monkeypatch.setattr(config, "gemm_backends", "aten,triton")
    monkeypatch.setattr(config, "autotune", "default")
    monkeypatch.setattr(config, "autotune_under_interpreter", True)

    def benchmark(self, template, output_layout, source, choices):
        configs = [c for c in choices if c is not gemm_choice.ATEN]
        timings = {str(c): template_ms + i for i, c in enumerate(configs)}
        return configs[0], timings | {"aten": aten_ms, gemm_choice.ROUND_TRIP: round_trip_ms}
    monkeypatch.setattr(gemm_choice.MatmulChoice, "_benchmark", benchmark)


def test_aten_faster_even_with_an_epilogue_falls_back(device, monkeypatch, tmp_path):
    if not has_template(device):
        pytest.skip("no GEMM template on this column")
    measured(monkeypatch, tmp_path, template_ms=2.0, aten_ms=1.0, round_trip_ms=0.5)
    x, w = rand(20, 16, device=device), rand(16, 17, device=device)
    check(lambda x, w: (x @ w).relu(), x, w)
    assert template_kernels() == []
    assert "even with an epilogue fused" in metrics.fallbacks["aten.mm.default"]


def test_template_kept_where_fusing_its_epilogue_pays(device, monkeypatch, tmp_path):
    """The template is slower than aten alone but not than aten plus an epilogue kernel:
    it runs where an epilogue fused into it, aten runs where none did."""
    if not has_template(device):
        pytest.skip("no GEMM template on this column")
    measured(monkeypatch, tmp_path / "first", template_ms=1.0, aten_ms=0.9, round_trip_ms=0.5)
    x, w = rand(20, 16, device=device), rand(16, 17, device=device)
    check(lambda x, w: (x @ w).relu(), x, w)
    assert len(template_kernels()) == 1 and metrics.generated_kernel_count == 1
    for i, fn in enumerate((lambda x, w: x @ w, lambda x, w: (lambda y: (y, y.relu() * 2))(x @ w))):
        torch._dynamo.reset()
        metrics.reset()
        # with y stored, fusing saves 0.25
        measured(monkeypatch, tmp_path / str(i), template_ms=1.0, aten_ms=0.7, round_trip_ms=0.5)
        sources = check(fn, x, w)
        assert template_kernels() == []
        assert "aten was faster" in metrics.fallbacks["aten.mm.default"]
        assert "torch.mm(arg0, arg1, out=" in sources[0]


def test_addmm_bias_alone_is_no_epilogue_to_fuse(device, monkeypatch, tmp_path):
    """An addmm's bias is added by aten.addmm too: with nothing else to fuse, a template
    slower than aten gives way to the addmm itself; with an activation, it stays."""
    if not has_template(device):
        pytest.skip("no GEMM template on this column")
    c, x, w = rand(17, device=device), rand(20, 16, device=device), rand(16, 17, device=device)
    measured(monkeypatch, tmp_path / "first", template_ms=1.0, aten_ms=0.9, round_trip_ms=0.5)
    sources = check(lambda c, x, w: torch.addmm(c, x, w, beta=0.5), c, x, w)
    assert template_kernels() == [] and metrics.generated_kernel_count == 0
    assert "torch.addmm(arg0, arg1, arg2, beta=0.5, alpha=1, out=" in sources[0]
    torch._dynamo.reset()
    metrics.reset()
    measured(monkeypatch, tmp_path / "second", template_ms=1.0, aten_ms=0.9, round_trip_ms=0.5)
    check(lambda c, x, w: torch.addmm(c, x, w).relu(), c, x, w)
    assert len(template_kernels()) == 1 and metrics.generated_kernel_count == 1


def test_large_shapes_choose_and_stay_right(device, monkeypatch):
    """cuda only: the real choice (template configs against cuBLAS) at an LLM-like shape."""
    if device != "cuda":
        pytest.skip("benchmarks a GPU")
    monkeypatch.setattr(config, "gemm_backends", "aten,triton")
    monkeypatch.setattr(config, "autotune", "default")
    x, w = rand(2048, 1024, dtype=torch.bfloat16, device=device), rand(1024, 2048, dtype=torch.bfloat16, device=device)
    b = rand(2048, dtype=torch.bfloat16, device=device)
    check(lambda x, w, b: F.gelu(x @ w + b), x, w, b, **tol(torch.bfloat16))
    assert tritonfuse.metrics.eager_graphs == 0


def test_generated_code_reads_like_a_matmul(device):
    if not has_template(device):
        pytest.skip("no GEMM template on this column")
    x, w = rand(20, 16, device=device), rand(16, 17, device=device)
    compiled = torch.compile(lambda x, w: (x @ w).relu(), backend="tritonfuse")
    _, sources = run_and_get_code(compiled, x, w)
    kernel = sources[1]
    assert "# GEMM template: out[20, 17] = a[20, 16] (strides 16, 1) @ b[16, 17] (strides 17, 1)" in kernel
    assert "tl.store(out_ptr0 + (17*xm + xn)" in kernel


# ---- the GPU flavour, compiled for Hopper without a GPU ----------------------------------------

TRITON_TYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def test_cuda_kernels_compile_for_sm90(monkeypatch, tmp_path):
    """The kernels the cuda column would run (libdevice math, every dtype, the largest tile)
    are generated from CPU tensors and compiled for an H100 (sm_90) by Triton's own
    compiler, offline: what the interpreter cannot check (static branches, tl.dot's
    options, shared memory, wgmma) is checked on every machine with Triton's NVIDIA backend."""
    import triton
    from triton.backends.compiler import GPUTarget
    from tritonfuse.codegen.triton import scheduling
    from tritonfuse.codegen.triton.overrides import TRITON_OPS
    from tritonfuse.runtime import async_compile
    from tritonfuse.runtime.triton_launcher import TritonLauncher, load_kernel
    if "nvidia" not in getattr(triton.backends, "backends", {}):
        pytest.skip("this Triton has no NVIDIA backend")
    cuda_like = scheduling.MatmulChoice(scheduling._templates, "cpu", tuple(TRITON_TYPES), use_libdevice=True)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(config, "cpu_backend", "triton")
    monkeypatch.setattr(scheduling.InterpretedTritonScheduling, "ops_table", TRITON_OPS)
    monkeypatch.setattr(scheduling.InterpretedTritonScheduling, "use_libdevice", True)
    monkeypatch.setattr(scheduling.InterpretedTritonScheduling, "matmul_choice", cuda_like)
    launches = []
    monkeypatch.setattr(TritonLauncher, "run", lambda self, *args: launches.append((self, args)))   # never run
    monkeypatch.setattr(config, "gemm_prologue_fusion", "cheap")
    cases = [(lambda x, w, b: F.gelu(x @ w + b), torch.bfloat16, [(512, 256), (256, 512), (512,)]),
             (lambda a, b: torch.bmm(a, b.transpose(1, 2)) * 0.5, torch.float32, [(4, 96, 64), (4, 80, 64)]),
             # prologues: float32 activations and weights cast to bfloat16 in the loads
             (lambda x, w: x.to(torch.bfloat16) @ w.to(torch.bfloat16), torch.float32, [(512, 256), (256, 512)])]
    for fn, dtype, shapes in cases:
        torch._dynamo.reset()
        launches.clear()
        torch.compile(fn, backend="tritonfuse")(*[torch.randn(s).to(dtype) for s in shapes])
        (launcher, args), = [(l, a) for l, a in launches if l.kind == "template"]
        jit = load_kernel(launcher.name, launcher.source)
        blocks = launcher.candidates[0]
        signature = {p.name: "constexpr" if p.name in blocks.kwargs else "*" + TRITON_TYPES[a.dtype]
                     for p, a in zip(jit.params, list(args) + [None] * len(blocks.kwargs))}
        # as a launch specializes them: tensors 16-byte aligned
        aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(args)}
        compiled = triton.compile(triton.compiler.ASTSource(jit, signature, dict(blocks.kwargs), aligned),
                                  target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": blocks.num_warps, "num_stages": blocks.num_stages})
        assert "tt.dot" in compiled.asm["ttir"] and compiled.asm["cubin"]
        if dtype == torch.bfloat16:     # tensor cores, and the k loop's loads pipelined
            assert "warp_group_dot" in compiled.asm["ttgir"] and "async_copy" in compiled.asm["ttgir"]
        # what the cuda column compiles ahead, in the compile pool: the generated pointers
        # (aligned) and no size arguments (a template of static sizes)
        argspec = async_compile.ArgSpec.aligned([a.dtype for a in args], ())
        futures, _ = async_compile.CompilePool(workers=0).submit(
            async_compile.KernelSource(launcher.name, launcher.source), [blocks], argspec, GPUTarget("cuda", 90, 32))
        assert futures[blocks].result().asm["cubin"]


def test_compile_options(monkeypatch, caplog):
    from tritonfuse.compile_options import CompileOptions
    monkeypatch.setattr(config, "max_autotune", False)
    assert not CompileOptions.from_torch_compile().max_autotune
    assert CompileOptions.from_torch_compile("max-autotune").max_autotune
    assert CompileOptions.from_torch_compile("max-autotune-no-cudagraphs").max_autotune
    assert CompileOptions.from_torch_compile(None, {"max_autotune": True}).max_autotune
    monkeypatch.setattr(config, "max_autotune", True)          # TRITONFUSE_MAX_AUTOTUNE=1
    assert CompileOptions.from_torch_compile("default").max_autotune
    assert not CompileOptions.from_torch_compile(None, {"max_autotune": False}).max_autotune
    # CUDA graphs as torch.compile's modes have them; options override the mode
    monkeypatch.setattr(config, "cudagraphs", False)
    assert CompileOptions.from_torch_compile("max-autotune").cudagraphs
    assert not CompileOptions.from_torch_compile("max-autotune-no-cudagraphs").cudagraphs
    assert CompileOptions.from_torch_compile("reduce-overhead") == CompileOptions(max_autotune=True, cudagraphs=True)
    assert not CompileOptions.from_torch_compile("max-autotune", {"cudagraphs": False}).cudagraphs
    with caplog.at_level("WARNING", logger="tritonfuse"):
        CompileOptions.from_torch_compile(None, {"no_such_option_for_test": 1})
        CompileOptions.from_torch_compile(None, {"no_such_option_for_test": 1})
    assert caplog.text.count("ignoring torch.compile's option 'no_such_option_for_test'") == 1
