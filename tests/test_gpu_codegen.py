"""The GPU spelling of the Triton kernels compiles, checked on a machine without a GPU.

The interpreter column runs kernels spelled for the interpreter (pure-tl helpers where a
GPU uses libdevice), so what only the cuda column compiles goes unchecked there:
libdevice's float32/float64/integer variants, tl functions that take one dtype only
(tl.sqrt_rn is float32-only), bool operands. Here each kernel is generated in its cuda
spelling for CPU tensors and compiled ahead of time for an sm_90 target down to a cubin,
with the LLVM and ptxas that Triton bundles; nothing is launched, so results are not
compared (the cuda column does that on a GPU)."""
import math

import pytest
import torch
import torch.nn.functional as F

import tritonfuse
from tritonfuse import config

triton = pytest.importorskip("triton")


class _Sm90Driver:
    """Just enough of a Triton driver for JITFunction.warmup: an H100 as the target."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 0

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        return GPUTarget("cuda", 90, 32)


@pytest.fixture
def compiled_for_gpu(monkeypatch, tmp_path):
    """Kernels of CPU tensors in their cuda spelling, compiled for sm_90 at their first
    launch instead of run; yields the list of (kernel source, CompiledKernel)."""
    from triton.backends import backends
    from triton.runtime.driver import driver

    from tritonfuse.codegen.triton.overrides import TRITON_OPS
    from tritonfuse.codegen.triton.scheduling import InterpretedTritonScheduling
    from tritonfuse.runtime import triton_launcher
    if "nvidia" not in backends:
        pytest.skip("this Triton has no NVIDIA backend")
    monkeypatch.setattr(config, "cpu_backend", "triton")
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))   # no graph compiled in the other spelling
    monkeypatch.setattr(InterpretedTritonScheduling, "ops_table", TRITON_OPS)
    monkeypatch.setattr(InterpretedTritonScheduling, "use_libdevice", True)
    monkeypatch.setattr(InterpretedTritonScheduling, "reports_zero_division", False)
    compiled = []

    def compile_ahead(launcher, args):
        launcher._candidates = launcher.candidates
        cfg = launcher.chosen_config = launcher._candidates[0]
        loaded = triton_launcher.load_kernel(launcher.name, launcher.source, config.cache_dir)
        fresh = triton.jit(loaded.fn)   # its own caches: no entry for the pretend target elsewhere
        kernel = fresh.warmup(*args, grid=(1,), num_warps=cfg.num_warps, num_stages=cfg.num_stages, **cfg.kwargs)
        compiled.append((launcher.source, kernel))
        launcher.run = lambda *call_args: None

    monkeypatch.setattr(triton_launcher.TritonLauncher, "_first_run", compile_ahead)
    monkeypatch.setattr(triton_launcher.TritonLauncher, "_bind", lambda self, cfg, numels=None: lambda *args: None)
    previous = driver._active
    driver.set_active(_Sm90Driver())
    try:
        yield compiled
    finally:
        driver._active = previous


def _compile(fn, *inputs, dynamic=False):
    with torch.no_grad():
        torch.compile(fn, backend="tritonfuse", dynamic=dynamic)(*inputs)
    assert tritonfuse.metrics.eager_graphs == 0


def _assert_cubins(compiled, count):
    assert len(compiled) >= count, len(compiled)
    for source, kernel in compiled:
        assert kernel.asm.get("cubin"), source


UNARY = [
    torch.asin, torch.acos, torch.atan, torch.sinh, torch.cosh, torch.asinh, torch.acosh, torch.atanh, torch.log10,
    torch.erfc, torch.lgamma, torch.digamma, torch.erfinv, torch.i0, torch.sinc, torch.special.erfcx,
    torch.special.i0e, torch.special.i1, torch.special.i1e, torch.special.ndtri, torch.special.log_ndtr,
    torch.special.entr, torch.special.spherical_bessel_j0, lambda x: torch.polygamma(1, x),
    # the basics, whose float64 forms only a GPU compile checks
    torch.sqrt, torch.rsqrt, torch.exp, torch.expm1, torch.log1p, torch.sin, torch.tan, torch.tanh, torch.erf,
    torch.sigmoid, torch.round, torch.trunc,
]
BINARY = [torch.atan2, torch.hypot, torch.copysign, torch.nextafter, torch.fmax, torch.fmin, torch.logaddexp,
          torch.logaddexp2, torch.heaviside, torch.special.xlog1py, torch.pow]


def _all_math(x, y):
    return sum(f(x) for f in UNARY) + sum(f(x, y) for f in BINARY) + torch.signbit(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_special_functions_compile_for_a_gpu(compiled_for_gpu, dtype):
    x, y = torch.rand(37, dtype=dtype) + 0.1, torch.randn(37, dtype=dtype)
    _compile(_all_math, x, y)
    assert not tritonfuse.metrics.fallbacks, tritonfuse.metrics.fallbacks
    _assert_cubins(compiled_for_gpu, 1)
    assert "libdevice.erfcx(" in compiled_for_gpu[0][0]   # the cuda spelling, not the interpreter's


def test_integer_and_bool_operands_compile_for_a_gpu(compiled_for_gpu):
    def fn(i, b):
        return (torch.atan(i), torch.lgamma(i), torch.special.i1e(i), torch.signbit(i), torch.sqrt(i),
                torch.fmax(i, i.flip(0)), torch.heaviside(i, i), torch.copysign(i, i), torch.atan2(i, i),
                torch.heaviside(b, b), torch.fmax(b, b), torch.copysign(b, b), torch.signbit(b), torch.abs(b))
    i = torch.arange(-7, 30, dtype=torch.int64)
    _compile(fn, i, i > 3)
    assert not tritonfuse.metrics.fallbacks, tritonfuse.metrics.fallbacks
    _assert_cubins(compiled_for_gpu, 1)


@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_pooling_padding_and_upsampling_compile_for_a_gpu(compiled_for_gpu, dtype):
    def fn(x):
        pooled = F.max_pool2d(x, 3, 2, 1) + F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)
        return (F.pad(pooled, (1, 1, 1, 1), mode="reflect"), F.pad(x, (2, 0, 1, 3), mode="replicate"),
                F.interpolate(x, scale_factor=2, mode="bilinear"), torch.roll(torch.flip(x, [-1]), 2, -2).tril(),
                F.adaptive_avg_pool2d(x, (3, 4)), F.max_pool2d(x, 2, return_indices=True)[1])
    _compile(fn, torch.randn(2, 3, 9, 11).to(dtype))
    assert not tritonfuse.metrics.fallbacks, tritonfuse.metrics.fallbacks
    _assert_cubins(compiled_for_gpu, 1)


def test_symbolic_size_kernels_compile_for_a_gpu(compiled_for_gpu):
    """Kernels that take their sizes as arguments (dynamic shapes)."""
    def fn(x):
        return F.max_pool2d(F.pad(x, (2, 1, 1, 2), mode="reflect"), 3, 2, 1).erfinv() * math.pi, torch.roll(x, 3, -1)
    _compile(fn, torch.rand(2, 3, 9, 11, dtype=torch.float64), dynamic=True)
    assert tritonfuse.metrics.symbolic_graphs == 1
    _assert_cubins(compiled_for_gpu, 1)
