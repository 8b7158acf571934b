"""Ops of torch's OpInfo table (``op_db``), compiled with tritonfuse on every column of
the device matrix and compared with eager, as Inductor's test_torchinductor_opinfo does.

Each chosen sample runs alone and between generated pointwise ops (``x * 1.0`` on every
floating input, ``y + 0.0`` on every floating output), so fallback outputs feed kernels
and kernels feed fallbacks (scripts/opinfo_harness.py). An op must

  * pass with kernels generated, or
  * pass as aten fallbacks only, if it is an allowed fallback (Inductor does the same), or
  * fail as EXPECTED_FAILURES says, for a reason that holds for Inductor too.

A graph run eagerly, a wrong value or a crash fails the test (tests/opinfo_expectations.py
holds the tables).

By default a fixed, representative sample runs (pointwise, reductions, views, indexing,
normalizations, fallbacks; float32 plus half and integer dtypes), one sample each.
``TRITONFUSE_OPINFO=full`` runs every op of op_db in float32, bfloat16 (float16 where
bfloat16 is unsupported) and int64 (int32), ``TRITONFUSE_OPINFO_SAMPLES`` samples each
(default 2); ``scripts/opinfo_sweep.py`` runs the same sweep in worker processes and writes
the tables of docs/results/.
"""
import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from opinfo_expectations import PENDING_LOWERINGS, allowed_fallback, expected_failure  # noqa: E402
from scripts.opinfo_harness import GOOD, TritonfuseCompiler, op_name, op_table, run_op  # noqa: E402
from tritonfuse import config  # noqa: E402

FULL = os.environ.get("TRITONFUSE_OPINFO", "") == "full"
SAMPLES = int(os.environ.get("TRITONFUSE_OPINFO_SAMPLES", "2" if FULL else "1"))

f32, bf16, f16, i64, i32, b8 = torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32, torch.bool

# The sample CI runs: (op, dtypes). Chosen to cover each kind of lowering and plumbing.
FAST_SAMPLE = [
    # pointwise, type promotion, integer math
    ("add", (f32, bf16, i64)), ("sigmoid", (f32, f16)), ("where", (f32,)), ("clamp", (f32, i32)),
    ("nn.functional.gelu", (f32,)), ("pow", (f32,)), ("remainder", (i64,)), ("lerp", (f32,)),
    ("nn.functional.cosine_similarity", (bf16,)),   # a float32 0-d eps beside bf16 norms
    # reductions
    ("sum", (f32, bf16, i64)), ("amax", (f32,)), ("argmax", (f32,)), ("var_mean", (f32,)), ("any", (b8,)),
    ("logsumexp", (f32,)), ("masked.var", (f32,)), ("cumsum", (bf16,)),
    # views
    ("transpose", (f32,)), ("squeeze", (f32,)), ("expand", (f32,)), ("narrow", (f32,)), ("tensor_split", (f32,)),
    ("as_strided", (f32,)),
    # creation, concatenation and indexing
    ("new_full", (f32,)), ("arange", (i64,)), ("cat", (f32,)), ("constant_pad_nd", (f32,)),
    ("__getitem__", (f32,)),
    # normalizations
    ("softmax", (f32, bf16)), ("native_layer_norm", (f32,)), ("nn.functional.batch_norm", (f32,)),
    ("nn.functional.group_norm", (f32,)),
    # aten fallbacks between kernels
    ("mm", (f32,)), ("sort", (f32,)), ("nn.functional.conv2d", (f32,)), ("linalg.inv", (f32,)),
]


def _full_dtypes(op):
    supported = set(op.supported_dtypes("cpu"))
    wanted = [f32, bf16 if bf16 in supported else f16, i64 if i64 in supported else i32]
    return tuple(dict.fromkeys(d for d in wanted if d in supported))


def _cases():
    ops = {op_name(op): op for op in op_table()}
    if FULL:
        return [(name, dtype) for name, op in ops.items() for dtype in _full_dtypes(op)]
    missing = [name for name, _ in FAST_SAMPLE if name not in ops]
    assert not missing, f"not in op_db: {missing}"
    return [(name, dtype) for name, dtypes in FAST_SAMPLE for dtype in dtypes]


CASES = _cases()
OPS = {op_name(op): op for op in op_table()}


def _column(device):
    if device == "cpu":
        return "triton-interpret" if config.cpu_backend == "triton" else "cpu"
    return device


@pytest.mark.parametrize("name,dtype", CASES, ids=[f"{n}-{str(d).replace('torch.', '')}" for n, d in CASES])
def test_opinfo(device, name, dtype):
    op = OPS[name]
    if dtype not in op.supported_dtypes(device):
        pytest.skip(f"{name} does not support {dtype} on {device}")
    result = run_op(TritonfuseCompiler(), op, device, dtype, samples=SAMPLES)
    reason = expected_failure(name, _column(device))
    if reason is not None:
        # the fast sample may not reach the failing sample; the full sweep must
        assert not (FULL and result.outcome in GOOD), \
            f"{name} now passes on {_column(device)}: remove it from EXPECTED_FAILURES"
        if result.outcome not in GOOD:
            pytest.xfail(reason)
    if result.outcome == "skip":
        pytest.skip(result.detail)
    assert result.outcome in GOOD, f"{name} {dtype}: {result.outcome}: {result.detail}"
    if result.outcome == "fallback" and allowed_fallback(name, _column(device)) is None:
        why = PENDING_LOWERINGS.get(name, "Inductor generates kernels for it")
        pytest.fail(f"{name} {dtype} ran only as aten fallbacks ({', '.join(result.fallback_ops())}): {why}")
