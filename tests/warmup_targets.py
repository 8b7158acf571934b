"""Small user targets for tests/test_warmup_script.py (``--target tests/warmup_targets.py:NAME``)."""
import torch

from tritonfuse.runtime.triton_launcher import TritonLauncher


def softmax_fn(x):
    """Compiled by tritonfuse: one persistent-reduction kernel."""
    return torch.softmax(x * 2.0, dim=-1)


def matmul_relu_fn(x, w):
    """Under --max-autotune: the GEMM template against aten, then the relu (fused or not)."""
    return (x @ w).relu()


_ADD_SOURCE = '''import triton
import triton.language as tl


@triton.jit
def triton_poi_warmup_add_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tmp0 = tl.load(in_ptr0 + xindex, xmask)
    tmp1 = tl.load(in_ptr1 + xindex, xmask)
    tl.store(out_ptr0 + xindex, tmp0 + tmp1, xmask)
'''
_launchers = {}


@torch._dynamo.disable
def _launch_add(x, y):
    n = x.numel()
    key = (n, x.device.type)
    if key not in _launchers:
        _launchers[key] = TritonLauncher("triton_poi_warmup_add_0", _ADD_SOURCE, "pointwise",
                                         {"x": n}, [2], x.device.type)
    out = torch.empty_like(x)
    _launchers[key].run(x, y, out, n)
    return out


def launcher_add_fn(x, y):
    """Runs a hand-written Triton kernel through TritonLauncher (no compiler needed)."""
    return _launch_add(x.contiguous(), y.contiguous())


def broken_fn(x):
    raise RuntimeError("this target always fails")
