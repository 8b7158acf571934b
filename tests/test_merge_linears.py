"""Linears on one input merged into one matmul (tritonfuse/merge_linears.py), and saved
activations copied out of a mostly dead buffer (graph.py, ``_saved_views_to_compact``):
every column, against eager, in training and inference."""
import pytest
import torch
from torch import nn

from common import assert_same
from tritonfuse import config, metrics


class Block(nn.Module):
    """Attention's q/k/v projections (with biases) and a gated MLP's gate/up (without), as
    in Llama: the value part goes to attention unchanged and is saved for its backward."""

    def __init__(self, width=32, hidden=48, heads=4):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v = (nn.Linear(width, width) for _ in range(3))
        self.o = nn.Linear(width, width, bias=False)
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        b, s, w = x.shape

        def heads(t):
            return t.view(b, s, self.heads, w // self.heads).transpose(1, 2)
        q, k, v = heads(self.q(x)), heads(self.k(x).sin()), heads(self.v(x))
        a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, w))
        return x + self.down(nn.functional.silu(self.gate(x)) * self.up(x))


def _tolerance(dtype):
    return {"atol": 2e-2, "rtol": 2e-2} if dtype == torch.bfloat16 else {"atol": 1e-4, "rtol": 1e-4}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_training_step_matches_eager(device, dtype):
    torch.manual_seed(0)
    model = Block().to(device, dtype)
    reference = Block().to(device, dtype)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 16, 32, device=device, dtype=dtype)
    compiled = torch.compile(model, backend="tritonfuse")
    for _ in range(2):   # the second step adds into the gradients of the first
        compiled(x).square().mean().backward()
        reference(x).square().mean().backward()
    assert metrics.merged_linear_groups == 2      # q/k/v and gate/up
    assert metrics.eager_graphs == 0
    for (name, p), r in zip(model.named_parameters(), reference.parameters()):
        assert p.grad.stride() == p.stride(), name   # the layout contract of .grad
        assert_same(p.grad, r.grad, **_tolerance(dtype))


def test_optimizer_steps_match_eager(device):
    torch.manual_seed(0)
    model, reference = Block().to(device), Block().to(device)
    reference.load_state_dict(model.state_dict())
    optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (model, reference)]
    compiled = torch.compile(model, backend="tritonfuse")
    for step in range(3):
        x = torch.randn(2, 16, 32, device=device, generator=None)
        for fn, optimizer in zip((compiled, reference), optimizers):
            optimizer.zero_grad(set_to_none=step % 2 == 0)
            fn(x).square().mean().backward()
            optimizer.step()
    for p, r in zip(model.parameters(), reference.parameters()):
        assert_same(p, r, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("policy, merged", [("train", 0), ("all", 2), ("off", 0)])
def test_inference_merges_only_when_asked(device, monkeypatch, policy, merged):
    monkeypatch.setattr(config, "merge_linears", policy)
    torch.manual_seed(0)
    model = Block().to(device).eval()
    x = torch.randn(2, 16, 32, device=device)
    with torch.no_grad():
        expected = model(x)
        actual = torch.compile(model, backend="tritonfuse")(x)
    assert metrics.merged_linear_groups == merged
    assert_same(actual, expected, atol=1e-4, rtol=1e-4)


def test_symbolic_sizes_stay_symbolic(device):
    """Over several lengths in one process: the static first graph merges, the symbolic
    recompile stays symbolic (no third graph), and every length matches eager."""
    torch.manual_seed(0)
    model, reference = Block().to(device), Block().to(device)
    reference.load_state_dict(model.state_dict())
    compiled = torch.compile(model, backend="tritonfuse")
    for length in (8, 11, 16, 23):
        x = torch.randn(2, length, 32, device=device)
        compiled(x).square().mean().backward()
        reference(x).square().mean().backward()
        for p, r in zip(model.parameters(), reference.parameters()):
            assert_same(p.grad, r.grad, atol=1e-4, rtol=1e-4)
            p.grad = r.grad = None
    assert metrics.merged_linear_groups == 2       # the static graph's (merge_linears.py says why)
    assert metrics.symbolic_graphs == 2            # the recompile's forward and backward, only
    assert metrics.eager_graphs == 0


def test_a_merge_on_symbolic_sizes_adds_no_guard():
    """The rewrite's example values come from the Python dispatcher: on torch 2.11 the fake
    linear, run in C++, read a symbolic length as an int, which added a guard pinning it
    (every new length then compiled a static graph)."""
    from tritonfuse import merge_linears as merge_module
    a, b = nn.Linear(8, 8, bias=False), nn.Linear(8, 4, bias=False)   # matmul, as in Llama
    seen = {}

    def backend(gm, example_inputs):
        from torch._guards import detect_fake_mode
        shape_env = detect_fake_mode(example_inputs).shape_env
        guards = len(shape_env.guards)
        for group in merge_module._groups(gm.graph):
            merge_module._merge(gm.graph, group)
        seen["new guards"] = len(shape_env.guards) - guards
        seen["sizes"] = [tuple(n.meta["example_value"].shape) for n in gm.graph.nodes
                         if n.op == "call_function" and n.target is torch._C._nn.linear]
        gm.recompile()
        return gm.forward

    x = torch.randn(3, 5, 8)
    out = torch.compile(lambda x: (a(x), b(x)), backend=backend, dynamic=True)(x)
    assert seen["new guards"] == 0
    assert len(seen["sizes"]) == 1 and isinstance(seen["sizes"][0][1], torch.SymInt)
    for got, want in zip(out, (a(x), b(x))):
        assert_same(got, want, atol=1e-5, rtol=1e-5)
    assert metrics.eager_graphs == 0


def test_linears_that_differ_are_left_alone(device):
    """Different inputs, in_features, dtypes or bias presence: nothing to merge."""
    torch.manual_seed(0)
    a, b = nn.Linear(8, 8).to(device), nn.Linear(8, 8, bias=False).to(device)
    c = nn.Linear(6, 8).to(device)
    d = nn.Linear(8, 8).to(device, torch.float64)

    def fn(x, y, z):
        return a(x) + b(x), c(z), a(y), d(x.double())

    args = [torch.randn(4, n, device=device, requires_grad=True) for n in (8, 8, 6)]
    expected = fn(*args)
    actual = torch.compile(fn, backend="tritonfuse")(*args)
    assert metrics.merged_linear_groups == 0
    for got, want in zip(actual, expected):
        assert_same(got, want, atol=1e-5, rtol=1e-5)


def test_a_small_saved_view_of_a_large_buffer_is_copied_out(device):
    """``v`` is a third of the first matmul's output and the only part of it the backward
    needs (for the second matmul's weight gradient): the forward saves a copy of it, not
    a view that would keep the whole output alive until the backward."""
    torch.manual_seed(0)
    w = torch.randn(16, 48, device=device, requires_grad=True)
    w2 = torch.randn(16, 8, device=device, requires_grad=True)

    def fn(x):
        y = x @ w
        return y[:, 32:] @ w2, y[:, :32].sum()

    x = torch.randn(32, 16, device=device)
    compiled = torch.compile(fn, backend="tritonfuse")
    grads = []
    for f in (compiled, fn):
        out, total = f(x)
        grads.append(torch.autograd.grad(out.square().sum() + total, (w, w2)))
    assert metrics.compacted_saved_views == 1
    for got, want in zip(*grads):
        assert_same(got, want, atol=1e-4, rtol=1e-4)


def test_a_merge_that_fails_leaves_the_linears_as_they_were(device, monkeypatch):
    import tritonfuse.merge_linears as merge_module

    def broken(node):
        raise RuntimeError("injected")
    monkeypatch.setattr(merge_module, "_recomputed", broken)
    torch.manual_seed(0)
    model, reference = Block().to(device), Block().to(device)
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, 16, 32, device=device)
    torch.compile(model, backend="tritonfuse")(x).square().mean().backward()
    reference(x).square().mean().backward()
    assert metrics.merged_linear_groups == 0 and metrics.eager_graphs == 0
    for p, r in zip(model.parameters(), reference.parameters()):
        assert_same(p.grad, r.grad, atol=1e-4, rtol=1e-4)
