"""The ops of every transformer training step that used to run as aten fallbacks and cut
fusion: nll_loss forward/backward, embedding_dense_backward, _unsafe_masked_index (from
slice backward) and lift_fresh_copy. Losses and gradients are compared with eager on
every column of the device matrix; the fusion tests count the backward graph's kernels."""
import pytest
import torch
import torch.nn.functional as F

import tritonfuse
from common import rand
from tritonfuse import metrics
from tritonfuse.codegen.registry import get_scheduling_class
from tritonfuse.lowering import indexing
from tritonfuse.lowering.indexing import scatter_sum_lowered

MATMULS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default"}


def _triton(device) -> bool:
    return device == "cuda" or tritonfuse.config.cpu_backend == "triton"


def _embedding_backward_lowered(device) -> bool:
    """Whether embedding_dense_backward becomes a scatter: where the backend adds a row's
    gradients in a fixed order, as eager does, or may add them in none (float atomics on a
    GPU, outside deterministic mode)."""
    return scatter_sum_lowered(torch.device(device), "embedding_dense_backward")


def _assert_embedding_backward(device):
    """Lowered, or, where it cannot be as deterministic as eager, eager's own kernel."""
    if _embedding_backward_lowered(device):
        _assert_lowered("embedding_dense_backward", "index_put")
    else:
        assert "aten.embedding_dense_backward.default" in metrics.fallbacks, metrics.fallbacks


def _forward_backward(fn, inputs, grad_of, atol=1e-5, rtol=1e-5):
    """Run ``fn`` eagerly and compiled, backward through its (scalar or summed) result;
    compare results and the gradients of ``inputs[k] for k in grad_of``. Returns the
    kernels generated for the backward graph."""
    def run(compiled):
        args = [x.detach().clone().requires_grad_(k in grad_of) if isinstance(x, torch.Tensor) and
                x.is_floating_point() else x for k, x in enumerate(inputs)]
        call = torch.compile(fn, backend="tritonfuse", dynamic=False) if compiled else fn
        out = call(*args)
        before = len(metrics.generated_kernels)
        (out if out.dim() == 0 else out.float().sum()).backward()
        return out, [args[k].grad for k in grad_of], metrics.generated_kernels[before:]
    expected, expected_grads, _ = run(False)
    actual, grads, backward_kernels = run(True)
    assert metrics.eager_graphs == 0
    torch.testing.assert_close(actual, expected, atol=atol, rtol=rtol)
    for g, e in zip(grads, expected_grads):
        torch.testing.assert_close(g, e, atol=atol, rtol=rtol)
    return backward_kernels


def _assert_lowered(*names):
    for name in names:
        assert not any(name in op for op in metrics.fallbacks), metrics.fallbacks


# ---- nll_loss -----------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(device, reduction, weighted):
    torch.manual_seed(0)
    logits = rand(9, 7, device=device)
    target = torch.randint(0, 7, (9,), device=device)
    target[2] = target[5] = -100                 # ignored rows
    weight = rand(7, device=device, low=0.1, high=2) if weighted else None

    def fn(x, t, w):
        return F.nll_loss(F.log_softmax(x, -1), t, weight=w, reduction=reduction)
    _forward_backward(fn, [logits, target, weight], grad_of=[0])
    _assert_lowered("nll_loss")
    assert set(metrics.fallbacks) <= MATMULS


def test_nll_loss_2d_and_custom_ignore_index(device):
    torch.manual_seed(0)
    logits = rand(2, 5, 3, 4, device=device)
    target = torch.randint(0, 5, (2, 3, 4), device=device)
    _forward_backward(lambda x, t: F.cross_entropy(x, t, ignore_index=2), [logits, target], grad_of=[0])
    _assert_lowered("nll_loss")


def test_cross_entropy_backward_is_one_kernel(device):
    """nll_loss_backward's one-hot scatter is pointwise: it fuses with log_softmax's backward."""
    torch.manual_seed(0)
    logits = rand(16, 33, device=device)
    target = torch.randint(0, 33, (16,), device=device)
    backward = _forward_backward(lambda x, t: F.cross_entropy(x * 2, t, ignore_index=3), [logits, target],
                                 grad_of=[0])
    assert metrics.fallbacks == {}, metrics.fallbacks
    assert len(backward) == 1, backward


# ---- embedding backward -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_backward_with_duplicates_and_padding(device, dtype):
    torch.manual_seed(0)
    weight = rand(20, 8, dtype=dtype, device=device)
    ids = torch.tensor([[1, 4, 4, 0], [19, 4, 1, 0]], device=device)
    y = rand(2, 4, 8, dtype=dtype, device=device)
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else {}
    _forward_backward(lambda w, i, b: F.embedding(i, w, padding_idx=0) * b, [weight, ids, y], grad_of=[0], **tol)
    _assert_embedding_backward(device)


def test_embedding_backward_scale_grad_by_freq(device):
    torch.manual_seed(0)
    weight = rand(12, 5, device=device)
    ids = torch.tensor([3, 3, 3, 7, 11, 7], device=device)
    _forward_backward(lambda w, i: F.embedding(i, w, scale_grad_by_freq=True).sin(), [weight, ids], grad_of=[0])
    _assert_embedding_backward(device)
    if _embedding_backward_lowered(device):
        _assert_lowered("masked_index")


def test_embedding_backward_of_a_transposed_gradient(device):
    """T5's relative position bias: the table's gradient is read across the grad's layout."""
    torch.manual_seed(0)
    weight, y = rand(32, 4, device=device), rand(4, 6, 6, device=device)
    ids = torch.randint(0, 32, (6, 6), device=device)
    _forward_backward(lambda w, i, b: F.embedding(i, w).permute(2, 0, 1) * b, [weight, ids, y], grad_of=[0])
    _assert_embedding_backward(device)


def test_embedding_backward_computes_its_gradient_in_the_scatter_kernel(device):
    """The pointwise math that feeds the embedding's gradient runs inside the scatter's
    kernel: the backward graph is the table's zero fill and the scatter."""
    torch.manual_seed(0)
    weight, y = rand(30, 16, device=device), rand(3, 10, 16, device=device)
    ids = torch.randint(0, 30, (3, 10), device=device)
    backward = _forward_backward(lambda w, i, b: (F.embedding(i, w) * b).tanh(), [weight, ids, y], grad_of=[0])
    _assert_embedding_backward(device)
    if _embedding_backward_lowered(device):
        assert metrics.fallbacks == {}, metrics.fallbacks
        assert len(backward) == 2, backward


def test_embedding_backward_fuses_into_the_layer_norm_backward(device):
    """Embeddings feed a layer norm in every transformer: on Triton the scatter joins the
    layer norm's backward kernel (atomic adds). The C++ backend keeps it in its own loop
    nest: that kernel's threads split the rows, which may hit one table row."""
    torch.manual_seed(0)
    weight, y = rand(40, 32, device=device), rand(2, 12, 32, device=device)
    ids = torch.randint(0, 40, (2, 12), device=device)
    backward = _forward_backward(lambda w, i, b: F.layer_norm(F.embedding(i, w), (32,)) * b, [weight, ids, y],
                                 grad_of=[0], atol=1e-4, rtol=1e-4)
    _assert_embedding_backward(device)
    if _embedding_backward_lowered(device):
        assert metrics.fallbacks == {}, metrics.fallbacks
        assert len(backward) == (2 if _triton(device) else 3), backward


def _embedding_backward_step(device, scale_grad_by_freq=False, dtype=torch.float32):
    torch.manual_seed(0)
    weight, y = rand(25, 6, device=device, dtype=dtype), rand(2, 7, 6, device=device, dtype=dtype)
    ids = torch.randint(0, 25, (2, 7), device=device)
    ids[0, :4] = 5                                   # colliding rows
    ids[1, 2] = 3                                    # the padding row
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else {}
    # in bfloat16, linear in the table (a fused cos would skip eager's rounding of its input)
    finish = (lambda v: v) if dtype == torch.bfloat16 else torch.cos
    _forward_backward(lambda w, i, b: finish(F.embedding(i, w, padding_idx=3, scale_grad_by_freq=scale_grad_by_freq)
                                             * b), [weight, ids, y], grad_of=[0], **tol)


def test_embedding_backward_is_eagers_kernel_where_sums_would_be_unordered(device, monkeypatch):
    """With a backend whose float sums land in no fixed order (atomics on a GPU), the
    decomposition declines where eager's kernel is deterministic and the lowering must be
    too: eager's embedding_dense_backward runs, as one fallback (not the decomposition's
    masked index_put). The column's backend is made unordered here, so CI checks the GPU's
    path."""
    monkeypatch.setattr(get_scheduling_class(device), "deterministic_scatter", False)
    monkeypatch.setattr(indexing, "UNORDERED_AS_TORCH_COMPILE", {})
    _embedding_backward_step(device)
    assert set(metrics.fallbacks) == {"aten.embedding_dense_backward.default"}, metrics.fallbacks


@pytest.mark.parametrize("deterministic,scale_grad_by_freq,dtype", [
    (False, False, torch.float32), (False, True, torch.float32), (False, False, torch.bfloat16),
    (True, False, torch.float32)])
def test_embedding_backward_with_atomics_as_torch_compile(device, monkeypatch, deterministic, scale_grad_by_freq,
                                                          dtype):
    """Where the op may add a row's gradients in no fixed order (CUDA: eager sorts, in about
    20 launches; Inductor and tritonfuse use float atomics), it becomes a fused scatter-add
    unless torch.use_deterministic_algorithms(True), which brings eager's kernel back. The
    column's backend is made unordered and given the GPU's policy, so CI checks both paths."""
    device_type = torch.device(device).type
    monkeypatch.setattr(get_scheduling_class(device), "deterministic_scatter", False)
    monkeypatch.setattr(indexing, "UNORDERED_AS_TORCH_COMPILE", {"embedding_dense_backward": (device_type,)})
    # index_add, which it decomposes into, adds in no fixed order in eager on CUDA only
    monkeypatch.setitem(indexing.EAGER_UNORDERED_WRITES, "index_add", (device_type,))
    torch.use_deterministic_algorithms(deterministic, warn_only=True)
    try:
        _embedding_backward_step(device, scale_grad_by_freq, dtype)
    finally:
        torch.use_deterministic_algorithms(False)
    if deterministic:
        assert set(metrics.fallbacks) == {"aten.embedding_dense_backward.default"}, metrics.fallbacks
    else:
        assert metrics.fallbacks == {}, metrics.fallbacks


# ---- slice backward, constants --------------------------------------------------------------

def test_slice_backward_masked_index(device):
    torch.manual_seed(0)
    x = rand(4, 9, device=device)
    _forward_backward(lambda a: a[:, 2:7].exp() * 2 + a[:, ::3].sum(), [x], grad_of=[0])
    _assert_lowered("masked_index", "slice")


def test_lift_fresh_copy_of_a_constant(device):
    x = rand(3, 4, device=device)
    _forward_backward(lambda a: a * torch.tensor([1.0, -2.0, 3.0, 0.5], device=a.device), [x], grad_of=[0])
    _assert_lowered("lift_fresh_copy")


# ---- a tiny language model's training steps ------------------------------------------------

class TinyLM(torch.nn.Module):
    def __init__(self, vocab=37, hidden=16):
        super().__init__()
        self.tokens = torch.nn.Embedding(vocab, hidden)
        self.positions = torch.nn.Embedding(12, hidden)
        self.norm = torch.nn.LayerNorm(hidden)
        self.head = torch.nn.Linear(hidden, vocab)

    def forward(self, ids, labels):
        positions = torch.arange(ids.shape[1], device=ids.device)
        h = self.norm(self.tokens(ids) + self.positions(positions))
        logits = self.head(torch.nn.functional.gelu(h))
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


def test_tiny_lm_training_steps_match_eager(device):
    torch.manual_seed(0)
    eager = TinyLM().to(device)
    model = TinyLM().to(device)
    model.load_state_dict(eager.state_dict())
    ids = torch.randint(0, 37, (3, 12), device=device)
    compiled = torch.compile(model, backend="tritonfuse")
    for step_model, m in ((eager, eager), (compiled, model)):
        optimizer = torch.optim.SGD(m.parameters(), lr=0.5)
        losses = []
        for _ in range(3):
            optimizer.zero_grad()
            loss = step_model(ids, ids)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        m.losses = losses
    assert metrics.eager_graphs == 0
    torch.testing.assert_close(torch.tensor(model.losses), torch.tensor(eager.losses), atol=1e-5, rtol=1e-5)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-5, rtol=1e-4)
    allowed = MATMULS if _embedding_backward_lowered(device) else MATMULS | {"aten.embedding_dense_backward.default"}
    assert set(metrics.fallbacks) <= allowed, metrics.fallbacks


def test_fill_with_a_tensor_and_safe_softmax(device):
    """T5's attention: fill.Tensor and _safe_softmax (softmax with fully masked rows at 0)."""
    x = rand(3, 5, device=device)
    x[1] = float("-inf")
    _forward_backward(lambda a: torch.ops.aten._safe_softmax(a, -1) + torch.ops.aten.fill(a, a[0, 0]), [x],
                      grad_of=[0])
    _assert_lowered("fill", "safe_softmax")


def test_training_ops_over_a_symbolic_sequence_length(device):
    """Embedding backward, cross entropy forward and backward, slice backward: one symbolic
    forward and one symbolic backward compile serve every sequence length."""
    torch.manual_seed(0)
    weight = rand(29, 8, device=device)

    def fn(w, ids, labels):
        h = F.embedding(ids, w, padding_idx=1)
        logits = h[:, 1:] @ w.t()
        return F.cross_entropy(logits.reshape(-1, 29), labels[:, 1:].reshape(-1), ignore_index=4)

    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    for length in (7, 33, 13):
        ids = torch.randint(0, 29, (2, length), device=device)
        w_eager, w_compiled = weight.clone().requires_grad_(), weight.clone().requires_grad_()
        expected, actual = fn(w_eager, ids, ids), compiled(w_compiled, ids, ids)
        expected.backward()
        actual.backward()
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(w_compiled.grad, w_eager.grad, atol=1e-5, rtol=1e-5)
    assert metrics.eager_graphs == 0 and metrics.static_specializations == 0
    assert metrics.symbolic_graphs == 2, metrics.symbolic_graphs
    allowed = MATMULS if _embedding_backward_lowered(device) else MATMULS | {"aten.embedding_dense_backward.default"}
    assert set(metrics.fallbacks) <= allowed, metrics.fallbacks


@pytest.mark.parametrize("rows", [2, 5])
def test_batch_norms_sharing_a_gradient_in_bf16(device, rows):
    """ResNet's downsample branch: two training-mode batch norms whose outputs are added.
    The backward of their weights is one column reduction over the batch with a
    per-channel epilogue, and a constant of the loop body (1 / rows) is read again in the
    epilogue: the C++ backend referred to it out of its scope, the build failed and the
    graph ran eagerly. (With 2 rows the input gradient is 0 up to rounding, amplified by
    1/std: the weights' gradients and the loss are what is compared.)"""
    torch.manual_seed(0)
    spread = torch.arange(rows, device=device).view(-1, 1, 1, 1)   # rows apart: no tiny variance
    a = (torch.randn(rows, 128, 1, 1, device=device) * 0.3 + spread).to(torch.bfloat16)
    b = (torch.randn(rows, 128, 1, 1, device=device) * 0.3 + spread).to(torch.bfloat16)
    w = torch.randn(rows, 128, 1, 1, device=device)

    def run(compiled, dtype=torch.bfloat16):
        torch.manual_seed(1)
        bn1 = torch.nn.BatchNorm2d(128).to(device, dtype)
        bn2 = torch.nn.BatchNorm2d(128).to(device, dtype)
        fn = lambda x, y: (torch.relu(bn1(x) + bn2(y)).float() * w).sum()   # rows far from relu's 0
        loss = (torch.compile(fn, backend="tritonfuse", dynamic=False) if compiled else fn)(
            a.to(dtype).requires_grad_(), b.to(dtype).requires_grad_())
        loss.backward()
        return [loss, bn1.weight.grad, bn1.bias.grad, bn2.weight.grad, bn2.bias.grad]

    reference = run(False, torch.float64)
    expected, actual = run(False), run(True)
    assert metrics.eager_graphs == 0, metrics.eager_graph_reasons
    for got, want, exact in zip(actual, expected, reference):
        # bf16: the compiled step is within twice eager's own error of the float64 result
        eager_error = (want.double() - exact).abs().max().item()
        assert (got.double() - exact).abs().max().item() <= 2 * eager_error + 1e-2 * exact.abs().max().item()
