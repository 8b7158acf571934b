"""A 0-d tensor takes part in eager's type promotion only when its category (bool < int <
float) is higher than the dimensioned operands': ``bf16_tensor / torch.tensor(0.5)`` is
bfloat16, ``int32_tensor / torch.tensor(3)`` is float32 (true division), ``clamp(int32,
tensor(3))`` int32. Lowerings that broadcast before promoting saw the 0-d tensor as a full
operand and returned float32 (the OpInfo cuda sweep found it on
``cosine_similarity``, whose decomposition clamps a bf16 norm by a float32 0-d eps)."""
import pytest
import torch

from common import check

SCALAR = 0.375   # exact in bf16 and f16

CASES = {
    "div": lambda x, s: x / s,
    "div_floor": lambda x, s: torch.div(x, s, rounding_mode="floor"),
    "div_trunc": lambda x, s: torch.div(x, s, rounding_mode="trunc"),
    "where_tensor_and_0d": lambda x, s: torch.where(x > 0, x, s),
    "where_0d_and_tensor": lambda x, s: torch.where(x > 0, s, x),
    "clamp_min": lambda x, s: torch.clamp_min(x, s),
    "clamp_max": lambda x, s: torch.clamp_max(x, s),
    "clamp_both": lambda x, s: torch.clamp(x, -s, s),
    "greater_than": lambda x, s: x > s,
    "cosine_similarity": lambda x, s: torch.nn.functional.cosine_similarity(x, x.flip(0) + s, dim=1),
}


# (case, dtype) pairs eager accepts: cosine_similarity takes floating inputs only
PAIRS = [(case, dtype) for case in sorted(CASES) for dtype in (torch.bfloat16, torch.float16, torch.int32)
         if not (case == "cosine_similarity" and dtype == torch.int32)]


@pytest.mark.parametrize("case,dtype", PAIRS, ids=[f"{c}-{str(d).replace('torch.', '')}" for c, d in PAIRS])
def test_a_0d_float32_tensor_keeps_the_dtype_of_the_tensor(device, case, dtype):
    x = (torch.randn(6, 19, device=device) * 4).to(dtype)
    s = torch.tensor(SCALAR, device=device)
    check(CASES[case], x, s)


def test_integer_0d_tensors_against_int32():
    """Same category: the 0-d int64 does not widen int32; true division still makes float."""
    x = torch.arange(-20, 37, dtype=torch.int32).reshape(3, 19)
    check(lambda x, s: (torch.clamp(x, -s, s), x / s, x > s, torch.where(x > 0, x, s)), x, torch.tensor(7))
