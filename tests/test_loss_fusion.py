"""Cross-entropy and its parts on every column of the device matrix: the loss and its
gradient against eager (bf16 and float32 logits, ignored rows, label smoothing, each
reduction); the looped (long-row) forward as one pass over the logits (online softmax:
running max and rescaled running sum); softmax and logsumexp of long rows, infinities
and NaN included; and scatters into a constant with one index per line (nll_loss's
backward, one_hot) as pointwise code that fuses into its reader."""
import re

import pytest
import torch
import torch.nn.functional as F

import tritonfuse
from common import check, kernel_count, rand
from tritonfuse import metrics
from tritonfuse.runtime import heuristics
from tritonfuse.testing import run_and_get_code

ROWS, CLASSES = 8, 300
LONG_ROW_CAP = 64   # rows longer than this take the looped form (see _looped)


def _triton(device) -> bool:
    return device == "cuda" or tritonfuse.config.cpu_backend == "triton"


@pytest.fixture
def _looped(monkeypatch):
    """Rows of CLASSES elements as a GPU's 32000-wide rows are: too long for registers."""
    monkeypatch.setattr(heuristics, "PERSISTENT_REDUCTION_MAX_RBLOCK", LONG_ROW_CAP)


def _targets(device, rows=ROWS, classes=CLASSES):
    target = torch.randint(0, classes, (rows,), device=device)
    target[1] = target[5] = -100   # ignored rows
    return target


def _wrapper(sources) -> str:
    """The generated wrapper module of the one graph compiled (it embeds its kernels)."""
    wrappers = [s for s in sources if "def call(" in s]
    assert len(wrappers) == 1, [s[:80] for s in wrappers]
    return wrappers[0]


def _r_loops(source) -> int:
    return len(re.findall(r"for roffset in range", source))


def _loss_and_grad(fn, logits, target, compiled):
    """fn's loss and the gradient of the logits; with the forward's generated code when
    compiled (the backward graph is compiled later, at backward())."""
    leaf = logits.detach().clone().requires_grad_(True)
    sources = []
    if compiled:
        loss, sources = run_and_get_code(torch.compile(fn, backend="tritonfuse", dynamic=False), leaf, target)
    else:
        loss = fn(leaf, target)
    (loss if loss.dim() == 0 else loss.sum()).backward()
    return loss, leaf.grad, sources


def _check_forward_backward(fn, logits, target, grad_tolerance=None):
    expected, expected_grad, _ = _loss_and_grad(fn, logits, target, compiled=False)
    actual, grad, forward_sources = _loss_and_grad(fn, logits, target, compiled=True)
    assert metrics.eager_graphs == 0
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
    tolerance = grad_tolerance or (dict(atol=2e-2, rtol=2e-2) if grad.dtype == torch.bfloat16 else {})
    torch.testing.assert_close(grad, expected_grad, **tolerance)
    return forward_sources


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_forward_backward(device, dtype, label_smoothing, reduction):
    torch.manual_seed(0)
    logits = rand(ROWS, 37, dtype=dtype, device=device)
    target = _targets(device, classes=37)

    def loss(x, t):   # a language model's loss: float32 math on low-precision logits
        return F.cross_entropy(x.float(), t, label_smoothing=label_smoothing, reduction=reduction)
    _check_forward_backward(loss, logits, target)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_cross_entropy_long_rows_forward_backward(device, dtype, _looped):
    torch.manual_seed(0)
    logits = rand(ROWS, CLASSES, dtype=dtype, device=device)
    logits[3, 7] = 40.0   # one large logit: the running max moves late in its row
    target = _targets(device)
    _check_forward_backward(lambda x, t: F.cross_entropy(x.float(), t, label_smoothing=0.1), logits, target)


def test_cross_entropy_forward_is_one_pass_over_long_rows(device, _looped):
    """Inference: amax and sum(exp(x - amax)) of each row in one r-loop (no second read of
    the logits for the sum), the target's logit gathered by a small kernel."""
    torch.manual_seed(0)
    logits = rand(ROWS, CLASSES, dtype=torch.bfloat16, device=device)
    target = _targets(device)
    sources = check(lambda x, t: F.cross_entropy(x.float(), t), logits, target)
    if _triton(device):
        wrapper = _wrapper(sources)
        assert _r_loops(wrapper) == 1, wrapper
        assert "online_softmax_update" in wrapper
        assert len(re.findall(r"def triton_red_", wrapper)) == 1


def test_log_softmax_forward_reads_long_rows_twice(device, _looped):
    """One pass for the row statistics, one to write the result: no third for the sum."""
    x = rand(ROWS, CLASSES, device=device)
    sources = check(lambda a: F.log_softmax(a, -1), x)
    if _triton(device):
        assert _r_loops(_wrapper(sources)) == 2


def _special_rows(rows, classes, device, dtype=torch.float32):
    x = rand(rows, classes, dtype=dtype, device=device)
    x[0, 5] = float("inf")            # +inf: softmax gives NaN, logsumexp inf
    x[1] = float("-inf")              # a row of -inf: softmax NaN, logsumexp -inf
    x[2, 9] = float("nan")            # NaN propagates
    x[3, 3:] = float("-inf")          # a few finite values among -inf
    x[4, 0] = 80.0                    # exp would overflow without the max shift
    x[4, -1] = 90.0                   # ... and the max grows in the last block
    return x


@pytest.mark.parametrize("looped", [False, True], ids=["persistent", "looped"])
def test_softmax_and_logsumexp_of_special_rows(device, looped, monkeypatch):
    if looped:
        monkeypatch.setattr(heuristics, "PERSISTENT_REDUCTION_MAX_RBLOCK", LONG_ROW_CAP)
    x = _special_rows(6, CLASSES, device)
    check(lambda a: (torch.softmax(a, -1), torch.log_softmax(a, 1), torch.logsumexp(a, 1),
                     torch.logsumexp(a, -1, keepdim=True)), x)


def test_softmax_and_logsumexp_of_long_bf16_rows(device, _looped):
    x = _special_rows(6, CLASSES, device, torch.bfloat16)
    check(lambda a: (torch.softmax(a, -1), torch.logsumexp(a, 1), torch.logsumexp(a.float(), 1)), x)


def test_logsumexp_is_one_pass_over_long_rows(device, _looped):
    """logsumexp shifts by the max with its infinities zeroed: the same one-pass sum, with
    inf (not NaN) in a row whose max is +inf."""
    x = _special_rows(6, CLASSES, device)
    sources = check(lambda a: torch.logsumexp(a, 1), x)
    if _triton(device):
        wrapper = _wrapper(sources)
        assert _r_loops(wrapper) == 1 and "online_softmax_update" in wrapper, wrapper


def test_logsumexp_over_leading_dim_and_several_dims(device, _looped):
    x = rand(CLASSES, 6, device=device)
    x[7, 2] = float("inf")
    check(lambda a: (torch.logsumexp(a, 0), torch.logsumexp(a.view(-1, 2, 3), (0, 2))), x)
    check(lambda a: torch.logsumexp(a.sum(), 0), x)   # a 0-d input: nothing to rewrite


# ---- scatter into a constant, one index per line: pointwise ---------------------------------

def _no_fallbacks():
    """No scatter run as aten (one_hot's range check, _assert_async, is eager's own)."""
    assert not [op for op in metrics.fallbacks if "scatter" in op or "index_put" in op], metrics.fallbacks


def test_cross_entropy_backward_has_no_scatter(device, _looped):
    """nll_loss_backward's scatter into zeros fuses with log_softmax's backward: one
    kernel for the gradient of the logits, nothing run as aten."""
    torch.manual_seed(0)
    logits = rand(ROWS, CLASSES, dtype=torch.bfloat16, device=device)
    target = _targets(device)
    leaf = logits.clone().requires_grad_(True)
    loss = torch.compile(lambda x, t: F.cross_entropy(x.float(), t), backend="tritonfuse", dynamic=False)(leaf, target)
    before = kernel_count()
    _, sources = run_and_get_code(loss.backward)
    _no_fallbacks()
    assert kernel_count() - before == 1
    if _triton(device):
        assert "atomic" not in _wrapper(sources)
    expected = logits.clone().requires_grad_(True)
    F.cross_entropy(expected.float(), target).backward()
    torch.testing.assert_close(leaf.grad, expected.grad, atol=2e-2, rtol=2e-2)


def test_one_hot_times_values_is_one_kernel(device):
    """The product and its sum in one kernel; on the CPU another checks one_hot's index
    range (all(i >= 0), all(i < 37)) for eager's _assert_async (eager's CUDA one_hot does
    not check, to avoid a sync)."""
    torch.manual_seed(0)
    x = rand(ROWS, 37, device=device)
    t = torch.randint(0, 37, (ROWS,), device=device)
    check(lambda a, i: (F.one_hot(i, 37).float() * a).sum(1), x, t)
    _no_fallbacks()
    assert kernel_count() == (1 if device == "cuda" else 2)   # eager checks the range on the CPU only


def test_scatter_into_zeros_with_one_wide_index_is_one_kernel(device):
    torch.manual_seed(0)
    src = rand(ROWS, 4, device=device)
    index = torch.randint(0, 37, (ROWS, 1), device=device)
    check(lambda s, i: torch.scatter(torch.zeros(ROWS, 37, device=s.device), 1, i, s).exp() + 1, src, index)
    _no_fallbacks()
    assert kernel_count() == 1


def test_scatter_into_zeros_with_colliding_two_wide_index(device):
    """Two writes per line that may land on one element: a real scatter, as eager."""
    torch.manual_seed(0)
    index = torch.randint(0, 5, (ROWS, 2), device=device)
    index[0] = torch.tensor([3, 3])
    src = rand(ROWS, 2, device=device)
    check(lambda i: torch.scatter(torch.zeros(ROWS, 5, device=i.device), 1, i, -1.0) * 2, index)
    check(lambda s, i: torch.scatter_add(torch.zeros(ROWS, 5, device=i.device), 1, i, s) + 1, src, index)
