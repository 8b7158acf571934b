"""Literals in generated kernels keep their dtype's precision: a float64 constant that float32
cannot hold (0.1) and an int64 constant beyond int32 (2**31, 2**40). Triton types a bare
Python float as float32 and an int in [2**31, 2**32) as uint32 unless a tensor beside it
gives its dtype, so a literal beside another literal (where's two branches) or stored
(full_like) lost its low bits (0.1 became 0.100000001490116) or failed to compile."""
import re

import pytest
import torch

from common import check

F64 = dict(atol=0, rtol=1e-13)   # float32 rounding of a constant is 1e-8 off

FLOAT64_CASES = {
    "full_like": lambda x: torch.full_like(x, 0.1),
    "where_of_two_constants": lambda x: torch.full_like(x, 0.2).masked_fill(x > 0, 0.1),
    "where_constant_and_tensor": lambda x: torch.where(x > 0, 0.1, x),
    "masked_fill": lambda x: x.masked_fill(x > 0, 0.1),
    "clamp_of_a_constant": lambda x: torch.full_like(x, 0.7).clamp(-0.1, 0.3) * x,
    "hardtanh_threshold": lambda x: torch.nn.functional.threshold(
        torch.nn.functional.hardtanh(x, -0.1, 0.3), 0.1, 0.7),
    "scale_and_tiny_shift": lambda x: x * 0.1 + 1e-300,
    "scalar_tensor": lambda x: x + torch.scalar_tensor(0.1, dtype=torch.float64),
    "pad_value": lambda x: torch.nn.functional.pad(x, (2, 3), value=0.1),
    "gelu_erf": lambda x: torch.nn.functional.gelu(x),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "sum_of_a_constant_where": lambda x: torch.full_like(x, 0.2).masked_fill(x > 0, 0.1).sum(-1),
    "index_fill": lambda x: torch.zeros_like(x).index_fill(1, torch.tensor([1, 3], device=x.device), 0.1),
    "pow_of_a_literal": lambda x: x.abs() ** 0.1,
    "atan2_of_a_constant": lambda x: torch.atan2(x, torch.full_like(x, 0.1)),
    "constant_row_sum": lambda x: torch.full_like(x, 0.1).sum(-1) + x[:, 0],
}


@pytest.mark.parametrize("case", sorted(FLOAT64_CASES))
def test_float64_constants_keep_their_precision(device, case):
    x = torch.randn(5, 37, dtype=torch.float64, device=device)
    check(FLOAT64_CASES[case], x, **F64)


INT64_CASES = {
    "add_beyond_int32": lambda x: x + 2 ** 40,
    "full": lambda x: torch.full((7,), 2 ** 40, device=x.device) + x[:7],
    "full_only": lambda x: torch.full_like(x, 2 ** 40 + 1),
    "where_uint32_range_and_negative": lambda x: torch.full_like(x, 2 ** 31).masked_fill(x > 0, -1),
    "where_two_wide_constants": lambda x: torch.full_like(x, -2 ** 35 - 5).masked_fill(x > 0, 2 ** 40 + 1),
    "masked_fill_wide": lambda x: x.masked_fill(x > 0, 2 ** 40),
    "clamp_wide": lambda x: (x * 2 ** 38).clamp(-2 ** 39 - 1, 2 ** 39 + 3),
    "index_fill_wide": lambda x: x.index_fill(0, torch.tensor([1, 3], device=x.device), 2 ** 40),
    # index expressions whose values leave int32 although the loop variables do not
    "arange_from_2_40": lambda x: torch.arange(2 ** 40, 2 ** 40 + 37, device=x.device) + x,
    "arange_below_minus_2_40": lambda x: torch.arange(-2 ** 40, -2 ** 40 + 37, device=x.device) + x,
    "arange_step_2_27": lambda x: torch.arange(0, 37 * 2 ** 27, 2 ** 27, device=x.device) + x,   # 36 * 2**27 > 2**31
    "arange_step_2_33_as_float64": lambda x: torch.arange(0, 37 * 2 ** 33, 2 ** 33, device=x.device,
                                                         dtype=torch.float64) + x,
}


@pytest.mark.parametrize("case", sorted(INT64_CASES))
def test_int64_constants_beyond_int32(device, case):
    x = torch.randint(-5, 5, (37,), dtype=torch.int64, device=device)
    check(INT64_CASES[case], x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_helper_functions_take_constants(device, dtype):
    """A helper function gets a literal operand as a tensor (it saw a constexpr: atan2's
    x.to(float64) failed to compile in every dtype)."""
    x = torch.randn(5, 37, dtype=dtype, device=device)
    tolerance = F64 if dtype == torch.float64 else dict(atol=1e-6, rtol=1e-5)
    check(lambda x: torch.atan2(x, torch.full_like(x, 0.1)) + torch.hypot(torch.full_like(x, 0.3), x), x,
          **tolerance)


def _kernel_sources(sources):
    return [m.group(1) for s in sources for m in re.finditer(r"source='''\\\n(.*?)''',", s, re.S)]


def test_float32_kernels_keep_bare_literals():
    """Only float64 (and wide int64) literals become tensors: a float32 kernel's stay literals."""
    from tritonfuse import config
    x = torch.randn(37)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(config, "cpu_backend", "triton")
        sources = check(FLOAT64_CASES["where_of_two_constants"], x)
    kernel, = _kernel_sources(sources)
    assert "tl.where(tmp1, 0.1, 0.2)" in kernel and "tl.full" not in kernel, kernel


@pytest.mark.parametrize("case, dtype, pointer", [
    ("where_of_two_constants", torch.float64, "*fp64"), ("full_like", torch.float64, "*fp64"),
    ("pow_of_a_literal", torch.float64, "*fp64"),
    ("where_uint32_range_and_negative", torch.int64, "*i64")])
def test_compiled_constants_take_the_kernels_dtype(tmp_path, case, dtype, pointer):
    """Compiled Triton (ahead of time for sm_90, no GPU needed) holds no 32-bit constant in these
    64-bit kernels: the interpreter columns need not type literals exactly as compiled Triton does."""
    triton = pytest.importorskip("triton")
    import importlib.util

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from tritonfuse import config
    fn = {**FLOAT64_CASES, **INT64_CASES}[case]
    x = torch.randn(37, dtype=dtype) if dtype.is_floating_point else torch.randint(-5, 5, (37,), dtype=dtype)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(config, "cpu_backend", "triton")
        sources = check(fn, x)
    kernel, = _kernel_sources(sources)
    path = tmp_path / "kernel.py"
    path.write_text(kernel)
    spec = importlib.util.spec_from_file_location("literal_kernel", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    jit, = [v for v in vars(module).values() if isinstance(v, triton.runtime.jit.JITFunction)]
    signature = {a: "constexpr" if a.endswith("BLOCK") else pointer if "ptr" in a else "i32" for a in jit.arg_names}
    source = ASTSource(fn=jit, constexprs={a: 64 for a in jit.arg_names if a.endswith("BLOCK")}, signature=signature)
    try:
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32))
    except RuntimeError as error:   # no CUDA toolchain in this Triton
        pytest.skip(f"Triton cannot compile for CUDA here: {error}")
    ttir = compiled.asm["ttir"]
    if dtype.is_floating_point:
        assert "f32" not in ttir and "0.10000000149" not in ttir, ttir   # (0.1 rounded to float32)
    else:   # (the old code failed to compile: uint32 2**31 beside -1)
        assert re.search(r"dense<2147483648> : tensor<\d+xi64>", ttir), ttir
