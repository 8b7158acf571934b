"""Layouts across fallbacks and graph boundaries.

Many aten ops that run as fallbacks (SDPA for the CPU, sort, convolutions) give outputs
whose strides follow their inputs'. The graph records eager's strides for every value, so
a fallback must get its inputs in eager's layout, or have its outputs read with the
strides its actual inputs give. Graph outputs keep eager's exact strides, expanded dims
included: the next graph (the backward reading a saved tensor) was traced with them.
"""
import torch
import torch.nn.functional as F

import tritonfuse
from common import assert_same, check, rand


def _attention_after_transpose(x, k, v):
    q = x.transpose(1, 2) * 1.5          # eager keeps x's memory order: not contiguous
    o = F.scaled_dot_product_attention(q, k, v)
    return o.transpose(1, 2).reshape(2, 64, -1)


def test_sdpa_reads_an_input_computed_in_eager_layout(device):
    x = rand(2, 64, 4, 32, device=device)
    k, v = rand(2, 4, 64, 32, device=device), rand(2, 4, 64, 32, device=device)
    check(_attention_after_transpose, x, k, v, atol=1e-4, rtol=1e-4)


def _sort_of_a_reused_value(x):
    y = x.transpose(0, 1) * 2.0          # read by many: realized before the sort sees it
    values, indices = torch.sort(y, dim=0)
    return values.t() + y.t() + y.sum() + (y * y).t() + torch.exp(y).t() + y.t() * 3, indices.t()


def test_fallback_output_layout_follows_its_actual_inputs(device):
    x = rand(16, 24, device=device)
    check(_sort_of_a_reused_value, x, atol=1e-4, rtol=1e-4)   # y.sum(): 384 terms, any order


def test_sdpa_on_a_value_held_in_another_layout(device):
    def fn(x, k, v):
        q = x.transpose(1, 2) * 1.5
        many = q + q.sum() + q * q + torch.exp(q) + torch.sin(q)   # q realized for its readers
        o = F.scaled_dot_product_attention(q, k, v)
        return o.transpose(1, 2).reshape(2, 64, -1), many
    x = rand(2, 64, 4, 32, device=device)
    k, v = rand(2, 4, 64, 32, device=device), rand(2, 4, 64, 32, device=device)
    # atol: q.sum() adds 16384 values of up to 4.5 in an order of the kernel's choosing
    check(fn, x, k, v, atol=1e-3, rtol=1e-4)


def test_expanded_output_keeps_eager_strides(device):
    def fn(x):
        return (x * 2).expand(4, 8), torch.sigmoid(x).expand(3, 4, 8)
    sources = check(fn, rand(1, 8, device=device))
    assert sources


class _TokenTypes(torch.nn.Module):
    """Like BERT's token_type_ids: a buffer of zeros expanded to the batch, so the forward
    graph saves an expanded tensor for the backward."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(4, 16)
        self.proj = torch.nn.Linear(16, 16)
        self.register_buffer("token_type_ids", torch.zeros(1, 64, dtype=torch.long), persistent=False)
        self.register_buffer("position_ids", torch.arange(64).expand(1, -1), persistent=False)

    def forward(self, x):
        batch, seq = x.shape[:2]
        positions = self.position_ids[:, :seq]
        types = torch.gather(self.token_type_ids.expand(positions.shape[0], -1), 1, positions)
        types = types.expand(batch, seq)
        return (self.proj(x + self.embed(types)) ** 2).mean()


def test_saved_expanded_tensor_reaches_the_backward(device):
    torch.manual_seed(0)
    model = _TokenTypes().to(device)
    compiled_model = _TokenTypes().to(device)
    compiled_model.load_state_dict(model.state_dict())
    x = rand(2, 32, 16, device=device)
    model(x).backward()
    loss = torch.compile(compiled_model, backend="tritonfuse")(x)
    loss.backward()
    assert tritonfuse.metrics.eager_graphs == 0
    for (name, p), q in zip(model.named_parameters(), compiled_model.parameters()):
        assert_same(q.grad, p.grad, atol=1e-5, rtol=1e-4)


def test_ensure_layout_handles_expanded_and_length_one_dims():
    from tritonfuse.runtime.wrapper_helpers import ensure_layout
    row = torch.randn(1, 8)
    dense = row.expand(4, 8).contiguous()
    fixed = ensure_layout(dense, (4, 8), (0, 1))
    assert fixed.stride() == (0, 1) and torch.equal(fixed, dense)
    column = torch.randn(8, 1)
    assert ensure_layout(column, (8, 1), (1, 1)) is column
    import pytest
    with pytest.raises(RuntimeError, match="differ along them"):
        ensure_layout(torch.randn(4, 8), (4, 8), (0, 1))


def test_safe_softmax_is_decomposed_into_kernels(device):
    # T5 and other models reach softmax through aten._safe_softmax (rows all -inf give 0)
    def fn(x):
        return torch.ops.aten._safe_softmax(x, -1) * 2
    x = rand(4, 16, device=device)
    x[1] = float("-inf")
    check(fn, x)
    assert "aten._safe_softmax.default" not in tritonfuse.metrics.fallbacks
