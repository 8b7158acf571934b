"""The demo model and the benchmark workloads, shared by scripts/ and tests/.

``TransformerBlock`` is the model that ``scripts/demo.py`` compiles and trains a step of.
``WORKLOADS`` is the table that ``scripts/bench.py`` times: each entry builds its own
inputs for a device (a small size set on the CPU, a larger one on GPUs), knows its ideal
memory traffic and the tolerance its compiled results are checked with against eager.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


# ----------------------------------------------------------------------------------------
# The demo model
# ----------------------------------------------------------------------------------------


class TransformerBlock(nn.Module):
    """A pre-LayerNorm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)).

    Attention is written out (``softmax(q @ k^T * scale) @ v``) instead of calling
    F.scaled_dot_product_attention, so that a compiler sees the matmuls (which run as
    fallbacks) and the scale / softmax around them (which fuse into kernels).
    """

    def __init__(self, dim: int = 256, heads: int = 4, mlp_ratio: int = 4, dropout: float = 0.0):
        super().__init__()
        if dim % heads != 0:
            raise ValueError(f"dim ({dim}) must be a multiple of heads ({heads})")
        self.dim = dim
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)

        self.ln1 = nn.LayerNorm(dim)
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)

        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, dim * mlp_ratio)
        self.act = nn.GELU()  # exact (erf) GELU
        self.fc2 = nn.Linear(dim * mlp_ratio, dim)
        self.mlp_dropout = nn.Dropout(dropout)

    def _split_heads(self, t: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = t.shape
        return t.view(batch, seq, self.heads, self.head_dim).transpose(1, 2)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q = self._split_heads(self.q_proj(x))
        k = self._split_heads(self.k_proj(x))
        v = self._split_heads(self.v_proj(x))
        scores = (q @ k.transpose(-2, -1)) * self.scale
        probs = self.attn_dropout(torch.softmax(scores, dim=-1))
        out = (probs @ v).transpose(1, 2).reshape(batch, seq, dim)
        return self.resid_dropout(self.out_proj(out))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp_dropout(self.fc2(self.act(self.fc1(x))))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        x = x + self.mlp(self.ln2(x))
        return x


def make_block_inputs(
    batch: int,
    seq: int,
    dim: int,
    device: str | torch.device,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    requires_grad: bool = False,
) -> torch.Tensor:
    """A random (batch, seq, dim) activation for TransformerBlock."""
    x = _randn((batch, seq, dim), device, dtype, seed)
    return x.requires_grad_(requires_grad)


def make_block(dim: int, heads: int, device: str | torch.device, dtype: torch.dtype = torch.float32,
               seed: int = 0, dropout: float = 0.0) -> TransformerBlock:
    """A TransformerBlock with weights that depend on ``seed`` only (not on the global RNG)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = TransformerBlock(dim=dim, heads=heads, dropout=dropout)
    return block.to(device=device, dtype=dtype)


# ----------------------------------------------------------------------------------------
# Helpers for the workload table
# ----------------------------------------------------------------------------------------


def _randn(shape, device, dtype=torch.float32, seed=0) -> torch.Tensor:
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)


def _is_gpu(device) -> bool:
    return torch.device(device).type != "cpu"


def tensor_bytes(obj: Any) -> int:
    """Bytes held by every tensor in ``obj`` (tensors, nested tuples / lists / dicts,
    and the parameters and buffers of nn.Modules)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, nn.Module):
        return sum(tensor_bytes(t) for t in obj.parameters()) + sum(tensor_bytes(t) for t in obj.buffers())
    if isinstance(obj, (tuple, list)):
        return sum(tensor_bytes(o) for o in obj)
    if isinstance(obj, dict):
        return sum(tensor_bytes(o) for o in obj.values())
    return 0


def read_once_write_once(inputs: tuple, outputs: Any) -> int:
    """Ideal memory traffic: every input read once and every output written once."""
    return tensor_bytes(inputs) + tensor_bytes(outputs)


_DTYPE_SHORT = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
                torch.float64: "f64", torch.int64: "i64", torch.int32: "i32"}


def describe_inputs(inputs: tuple) -> str:
    """A short label for a table: the shape and dtype of the first tensor input."""
    for t in inputs:
        if isinstance(t, torch.Tensor):
            shape = "x".join(str(s) for s in t.shape) or "scalar"
            return f"{shape} {_DTYPE_SHORT.get(t.dtype, str(t.dtype).replace('torch.', ''))}"
    return "-"


@dataclass(frozen=True)
class Workload:
    """One benchmark entry.

    fn            the function to compile; called as ``fn(*inputs)``
    make_inputs   ``make_inputs(device) -> tuple``; sizes are picked per device type
    ideal_bytes   ``ideal_bytes(inputs, outputs) -> int``, the traffic GB/s is quoted against
    tolerance     (atol, rtol) for comparing a compiled result with eager's
    """

    name: str
    fn: Callable[..., Any]
    make_inputs: Callable[[Any], tuple]
    ideal_bytes: Callable[[tuple, Any], int] = read_once_write_once
    tolerance: tuple[float, float] = (1e-4, 1e-4)


# ----------------------------------------------------------------------------------------
# The workloads: functions, then input makers, then the table
# ----------------------------------------------------------------------------------------

RMS_EPS = 1e-6


def pointwise_chain(x, y):
    return ((x * 1.5 + y).relu() * torch.sigmoid(x) - y).tanh()


def softmax_last(x):
    return torch.softmax(x, dim=-1)


def sub_softmax(x):
    return x - torch.softmax(x, dim=-1)


def layer_norm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w


def sigmoid_sum(x, y):
    return torch.sigmoid(torch.sum(x + y, dim=1))


def column_sum(x):
    return x.sum(0)


def transpose_add(x, y):
    return x.t() + y


def cross_entropy(logits, target):
    return F.cross_entropy(logits, target)


def var_mean_last(x):
    return torch.var_mean(x, dim=-1)


def block_forward(block, x):
    return block(x)


def mm_bias_gelu(x, w, b):
    return F.gelu(x @ w + b)


def mm_residual(x, w, r):
    return x @ w + r


def mm_to_bf16(x, w):
    return (x @ w).to(torch.bfloat16)


def _pair_maker(cpu_shape, gpu_shape, dtype):
    def make(device):
        shape = gpu_shape if _is_gpu(device) else cpu_shape
        return (_randn(shape, device, dtype, seed=0), _randn(shape, device, dtype, seed=1))
    return make


def _single_maker(cpu_shape, gpu_shape, dtype, scale=1.0):
    def make(device):
        shape = gpu_shape if _is_gpu(device) else cpu_shape
        return (_randn(shape, device, dtype, seed=0) * scale,)
    return make


def _norm_maker(cpu_shape, gpu_shape, with_bias):
    def make(device):
        shape = gpu_shape if _is_gpu(device) else cpu_shape
        x = _randn(shape, device, seed=0)
        w = 1.0 + 0.1 * _randn(shape[-1:], device, seed=1)
        if not with_bias:
            return (x, w)
        return (x, w, 0.1 * _randn(shape[-1:], device, seed=2))
    return make


def _transpose_maker(cpu_shape, gpu_shape):
    def make(device):
        rows, cols = gpu_shape if _is_gpu(device) else cpu_shape
        return (_randn((rows, cols), device, seed=0), _randn((cols, rows), device, seed=1))
    return make


def _cross_entropy_maker(cpu_shape, gpu_shape):
    def make(device):
        batch, classes = gpu_shape if _is_gpu(device) else cpu_shape
        logits = _randn((batch, classes), device, seed=0) * 2.0
        gen = torch.Generator(device=torch.device(device)).manual_seed(1)
        target = torch.randint(0, classes, (batch,), generator=gen, device=device)
        return (logits, target)
    return make


def _gemm_maker(cpu_mnk, gpu_mnk, extra):
    """x [M, K], w [K, N] in bf16 (scaled so that products stay O(1)), plus a bias [N]
    ("bias"), a residual [M, N] ("residual") or nothing."""
    def make(device):
        m, n, k = gpu_mnk if _is_gpu(device) else cpu_mnk
        x = _randn((m, k), device, torch.bfloat16, seed=0)
        w = (_randn((k, n), device, seed=1) / math.sqrt(k)).to(torch.bfloat16)
        if extra == "bias":
            return (x, w, _randn((n,), device, torch.bfloat16, seed=2))
        if extra == "residual":
            return (x, w, _randn((m, n), device, torch.bfloat16, seed=2))
        return (x, w)
    return make


def _gemm_workloads():
    """The matmul rows at LLM shapes (M x N x K, bf16): with a bias + GELU epilogue, with a
    residual epilogue, and cast to bf16 (a no-op on bf16: the plain matmul against cuBLAS)."""
    rows = []
    for label, gpu_mnk in (("4k", (4096, 4096, 4096)), ("8kx1k", (8192, 1024, 4096))):
        for name, fn, extra in (("mm_bias_gelu", mm_bias_gelu, "bias"), ("mm_residual", mm_residual, "residual"),
                                ("mm_to_bf16", mm_to_bf16, None)):
            rows.append(Workload(f"{name}_{label}", fn, _gemm_maker((256, 256, 256), gpu_mnk, extra),
                                 tolerance=(5e-2, 2e-2)))
    return rows


# The demo block as a benchmark: (batch, seq, dim, heads) per device type.
BLOCK_SIZES = {"cpu": (2, 128, 256, 4), "gpu": (8, 512, 1024, 16)}


def _make_block_workload_inputs(device):
    batch, seq, dim, heads = BLOCK_SIZES["gpu" if _is_gpu(device) else "cpu"]
    block = make_block(dim, heads, device, seed=0).eval()
    return (block, make_block_inputs(batch, seq, dim, device, seed=1))


# Sizes: CPU sizes keep a full 2-core run (compiles included) to a few minutes; GPU sizes
# are large enough (tens to hundreds of MB) that kernels, not launches, are timed.
WORKLOADS: list[Workload] = [
    Workload("pointwise_f32", pointwise_chain,
             _pair_maker((1024, 1024), (8192, 8192), torch.float32)),
    Workload("pointwise_bf16", pointwise_chain,
             _pair_maker((1024, 1024), (8192, 8192), torch.bfloat16),
             # Eager rounds each of the 6 intermediates to bf16 and `... - y` cancels; a
             # compiled kernel keeps them in f32. Both Inductor and tritonfuse differ from
             # eager by up to 0.04 (~10 bf16 ulps near 1) on the 8192x8192 GPU size.
             tolerance=(5e-2, 2e-2)),
    Workload("softmax_bf16", softmax_last,
             _single_maker((1024, 1024), (32768, 1024), torch.bfloat16, scale=3.0),
             tolerance=(1e-2, 2e-2)),
    Workload("softmax_long_f32", softmax_last,
             _single_maker((32, 32768), (2048, 32768), torch.float32, scale=3.0),
             tolerance=(1e-6, 1e-4)),
    Workload("x_sub_softmax", sub_softmax,
             _single_maker((1024, 1024), (16384, 2048), torch.float32)),
    Workload("layer_norm", layer_norm,
             _norm_maker((1024, 1024), (16384, 2048), with_bias=True), tolerance=(1e-4, 1e-4)),
    Workload("rms_norm", rms_norm,
             _norm_maker((1024, 1024), (16384, 2048), with_bias=False), tolerance=(1e-4, 1e-4)),
    Workload("sigmoid_sum_dim1", sigmoid_sum,
             _pair_maker((8, 128, 1024), (64, 512, 1024), torch.float32), tolerance=(1e-4, 1e-4)),
    Workload("column_sum", column_sum,
             _single_maker((1024, 1024), (16384, 4096), torch.float32), tolerance=(1e-3, 1e-4)),
    Workload("transpose_add", transpose_add, _transpose_maker((1024, 1024), (8192, 8192))),
    Workload("cross_entropy", cross_entropy,
             _cross_entropy_maker((256, 8192), (4096, 32768)), tolerance=(1e-4, 1e-4)),
    Workload("var_mean", var_mean_last,
             _single_maker((1024, 1024), (16384, 2048), torch.float32), tolerance=(1e-4, 1e-4)),
    Workload("transformer_block", block_forward, _make_block_workload_inputs,
             tolerance=(1e-3, 1e-3)),
    *_gemm_workloads(),
]

WORKLOADS_BY_NAME: dict[str, Workload] = {w.name: w for w in WORKLOADS}


def select_workloads(filters: str | None) -> list[Workload]:
    """Workloads whose name contains any of the comma-separated substrings (all if None)."""
    if not filters:
        return list(WORKLOADS)
    wanted = [f.strip() for f in filters.split(",") if f.strip()]
    return [w for w in WORKLOADS if any(f in w.name for f in wanted)]
