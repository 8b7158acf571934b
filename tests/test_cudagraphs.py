"""CUDA graphs (mode="reduce-overhead", tritonfuse/runtime/cudagraphs.py).

On the cuda column the graphs are real CUDA graphs. On the CPU columns the capture and
replay are emulated (tests/cudagraph_emulation.py: a replay re-runs the graph and writes
its results into the static outputs, as a real replay leaves them), so the bookkeeping
around them — static inputs, parameters read in place, outputs overwritten by the next
replay, saved tensors and gradients still referenced, uncapturable graphs — is checked
everywhere."""
import pytest
import torch

import tritonfuse
from tritonfuse import config, metrics
from tritonfuse.runtime import cudagraphs

from common import assert_same, rand
from cudagraph_emulation import EmulatedDriver


@pytest.fixture
def graphs(device, monkeypatch):
    """The capture driver of this column: None for real CUDA graphs, else the emulation."""
    if device == "cuda":
        return None
    driver = EmulatedDriver()
    monkeypatch.setitem(cudagraphs.DRIVERS, "cpu", driver)
    return driver


def _mlp(device, dtype=torch.float32):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 32),
                               torch.nn.LayerNorm(32), torch.nn.ReLU(), torch.nn.Linear(32, 8)).to(device, dtype)


def _copy_of(model):
    import copy
    return copy.deepcopy(model)


def test_inert_on_cpu_tensors():
    """Without a GPU (or with CPU tensors) reduce-overhead runs the compiled graph as it
    is and says why."""
    def fn(x):
        return torch.relu(x) * 2

    x = rand(64)
    compiled = torch.compile(fn, backend="tritonfuse", mode="reduce-overhead")
    for _ in range(3):
        assert_same(compiled(x), fn(x))
    assert metrics.cudagraph_captures == 0
    assert list(metrics.cudagraph_skips.values()) == ["CPU tensors (arg0_1 on cpu)"]


@pytest.mark.parametrize("how", ["mode", "options", "config", "off"])
def test_opt_in(device, graphs, how, monkeypatch):
    kwargs = {"mode": {"mode": "reduce-overhead"}, "options": {"options": {"cudagraphs": True}},
              "off": {"options": {"cudagraphs": False}}}.get(how, {})
    if how in ("config", "off"):     # options override TRITONFUSE_CUDAGRAPHS=1
        monkeypatch.setattr(config, "cudagraphs", True)

    def fn(x):
        return torch.sigmoid(x) + 1

    compiled = torch.compile(fn, backend="tritonfuse", **kwargs)
    for _ in range(3):
        x = rand(32, device=device)
        assert_same(compiled(x), fn(x))
    assert metrics.cudagraph_captures == (0 if how == "off" else 1)
    assert metrics.cudagraph_replays == (0 if how == "off" else 2)


def test_capture_and_replay_match_eager(device, graphs):
    """Call 1 warms up, call 2 captures, later calls replay: each gives eager's result for
    its own inputs; only the activation is copied in, never the parameters."""
    model = _mlp(device).eval()
    compiled = torch.compile(model, backend="tritonfuse", mode="reduce-overhead")
    with torch.no_grad():
        for step in range(5):
            x = rand(4, 16, device=device)
            assert_same(compiled(x), model(x), atol=1e-4, rtol=1e-4)
            if step >= 1:
                assert metrics.cudagraph_captures == 1
                assert metrics.cudagraph_replays == step
                assert metrics.cudagraph_input_copies == step     # x, not the 8 parameters
    assert metrics.cudagraph_uncaptured_calls == 0
    assert not metrics.cudagraph_skips


def test_inputs_changed_in_place_are_read_again(device, graphs):
    def fn(x, y):
        return x * y + 1

    compiled = torch.compile(fn, backend="tritonfuse", mode="reduce-overhead")
    x, y = rand(64, device=device), rand(64, device=device)
    for _ in range(4):
        assert_same(compiled(x, y), fn(x, y))
        x.add_(1)       # same tensor, same address, new values
    assert metrics.cudagraph_replays == 3


def test_outputs_are_overwritten_by_the_next_replay(device, graphs):
    """torch's rule: a replay overwrites the outputs of the previous one. Holding one
    across calls marks it stale (on a GPU, touching it raises); small outputs are
    returned as copies and stay valid."""
    def fn(x):
        return torch.tanh(x) * 3, (x * x).sum()

    compiled = torch.compile(fn, backend="tritonfuse", mode="reduce-overhead")
    xs = [rand(2048, device=device) for _ in range(4)]
    compiled(xs[0])                       # warm-up
    first, first_sum = compiled(xs[1])    # captured
    kept = first.clone()
    second, second_sum = compiled(xs[2])  # replays over ``first``
    assert_same(second, fn(xs[2])[0])
    assert_same(kept, fn(xs[1])[0])
    assert_same(first_sum, fn(xs[1])[1])  # a copy: still the first call's
    assert_same(second_sum, fn(xs[2])[1])
    if graphs is None:
        with pytest.raises(RuntimeError, match="overwrote"):
            first + 1
    else:
        assert len(graphs.invalidated) == 1
        assert_same(first, second)        # what a real replay leaves in that memory
    del first, second
    third, _ = compiled(xs[3])            # nothing held: nothing to mark
    assert_same(third, fn(xs[3])[0])
    assert graphs is None or len(graphs.invalidated) == 1


def _train(model, optimizer, batches, accumulate=1):
    losses = []
    for step, (x, target) in enumerate(batches):
        loss = torch.nn.functional.mse_loss(model(x), target)
        loss.backward()
        losses.append(loss.detach().clone())
        if (step + 1) % accumulate == 0:
            optimizer.step()
            optimizer.zero_grad()
    return losses


@pytest.mark.parametrize("accumulate", [1, 2])
def test_training_loop_matches_eager(device, graphs, accumulate):
    """Several optimizer steps with forward and backward replayed from CUDA graphs give
    eager's parameters. With gradient accumulation the gradients of one backward are
    still held at the next: that backward runs without its graph."""
    model = _mlp(device)
    reference = _copy_of(model)
    batches = [(rand(8, 16, device=device), rand(8, 8, device=device)) for _ in range(6)]
    compiled = torch.compile(model, backend="tritonfuse", mode="reduce-overhead")
    losses = _train(compiled, torch.optim.Adam(model.parameters(), lr=1e-2), batches, accumulate)
    expected = _train(reference, torch.optim.Adam(reference.parameters(), lr=1e-2), batches, accumulate)
    assert_same(losses, expected, atol=1e-4, rtol=1e-4)
    for param, ref in zip(model.parameters(), reference.parameters()):
        assert_same(param, ref, atol=1e-4, rtol=1e-4)
    assert metrics.cudagraph_captures == 2, metrics.cudagraph_skips       # forward and backward
    assert metrics.cudagraph_replays >= 8
    # one copy-in per replay: the batch into the forward, the loss gradient into the
    # backward; parameters, optimizer-updated in place, and saved tensors are read in place
    assert metrics.cudagraph_input_copies == metrics.cudagraph_replays
    assert (metrics.cudagraph_uncaptured_calls > 0) == (accumulate > 1)


def test_two_forwards_before_one_backward(device, graphs):
    """The second forward would overwrite what the first saved for its backward: it
    runs without the graph."""
    model = _mlp(device)
    reference = _copy_of(model)
    compiled = torch.compile(model, backend="tritonfuse", mode="reduce-overhead")
    for step in range(4):
        a, b = rand(8, 16, device=device), rand(8, 16, device=device)
        (compiled(a).square().mean() + compiled(b).abs().mean()).backward()
        (reference(a).square().mean() + reference(b).abs().mean()).backward()
    for param, ref in zip(model.parameters(), reference.parameters()):
        assert_same(param.grad, ref.grad, atol=1e-4, rtol=1e-4)
    assert metrics.cudagraph_uncaptured_calls > 0


def test_batchnorm_training_updates_running_stats(device, graphs):
    """Buffers mutated by the graph (written back by aot_autograd after each call)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Linear(16, 4)).to(device)
    reference = _copy_of(model)
    compiled = torch.compile(model, backend="tritonfuse", mode="reduce-overhead")
    for _ in range(4):
        x = rand(16, 8, device=device)
        compiled(x).sum().backward()
        reference(x).sum().backward()
    for name, buffer in model.named_buffers():
        assert_same(buffer, dict(reference.named_buffers())[name], atol=1e-4, rtol=1e-4)
    for param, ref in zip(model.parameters(), reference.parameters()):
        assert_same(param.grad, ref.grad, atol=1e-4, rtol=1e-4)
    assert metrics.cudagraph_captures == 2, metrics.cudagraph_skips


def test_moved_parameter_runs_without_the_graph(device, graphs):
    model = _mlp(device).eval()
    compiled = torch.compile(model, backend="tritonfuse", mode="reduce-overhead")
    x = rand(4, 16, device=device)
    with torch.no_grad():
        for _ in range(3):
            compiled(x)
        model[0].weight.data = model[0].weight.data * 2      # new memory behind the same parameter
        assert_same(compiled(x), model(x), atol=1e-4, rtol=1e-4)
    assert metrics.cudagraph_uncaptured_calls == 1


def test_graphs_that_cannot_be_captured(device, graphs):
    def dynamic(x):
        return x.cos() + 1

    def data_dependent(x):
        return x.nonzero().sum() + x

    def mixed(x, y):
        return x * y

    cases = [(dynamic, dict(dynamic=True), (16, 24, 32), "dynamic shapes"),
             (data_dependent, {}, (16, 16, 16), "data-dependent")]
    if device == "cuda":
        cases.append((mixed, {}, (16, 16, 16), "CPU tensors"))
    for fn, kwargs, sizes, reason in cases:
        torch._dynamo.reset()
        metrics.reset()
        compiled = torch.compile(fn, backend="tritonfuse", mode="reduce-overhead", **kwargs)
        with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
            for n in sizes:
                args = [rand(n, device=device)] + ([torch.tensor(2.0)] if fn is mixed else [])
                assert_same(compiled(*args), fn(*args), atol=1e-4, rtol=1e-4)
        assert metrics.cudagraph_captures == 0
        assert any(reason in why for why in metrics.cudagraph_skips.values()), metrics.cudagraph_skips


def test_failed_capture_runs_the_compiled_graph(device, graphs, monkeypatch):
    """An op that synchronizes makes the capture fail: the graph runs as compiled."""
    driver = cudagraphs.DRIVERS["cuda" if device == "cuda" else "cpu"]

    def failing_capture(run, static_inputs, device):
        raise RuntimeError("operation not permitted when stream is capturing")
    monkeypatch.setattr(driver, "capture", failing_capture)

    def fn(x):
        return torch.exp(x) - 1

    compiled = torch.compile(fn, backend="tritonfuse", mode="reduce-overhead")
    for _ in range(3):
        x = rand(32, device=device)
        assert_same(compiled(x), fn(x))
    assert metrics.cudagraph_captures == 0
    assert "capture failed" in next(iter(metrics.cudagraph_skips.values()))


def test_memory_planned_wrapper_replays(device, graphs):
    """The in-place writes of the memory plan inside a captured graph."""
    ws = [rand(32, 32, device=device) / 8 for _ in range(4)]

    def mlp(x):
        for w in ws:
            x = torch.relu(x @ w) * 2
        return x

    compiled = torch.compile(mlp, backend="tritonfuse", mode="reduce-overhead")
    for _ in range(4):
        x = rand(8, 32, device=device)
        assert_same(compiled(x), mlp(x), atol=1e-4, rtol=1e-4)
    assert metrics.cudagraph_replays == 3
    assert tritonfuse.metrics.eager_graphs == 0


def test_outputs_outlive_the_compiled_function(device, graphs):
    """Outputs handed out from a graph's memory do not own it: the capture stays alive
    while they are referenced, even after its function is gone."""
    import gc

    def fn(x):
        return torch.tanh(x) * 3

    compiled = torch.compile(fn, backend="tritonfuse", mode="reduce-overhead")
    x = rand(4096, device=device)
    for _ in range(3):
        out = compiled(x)
    expected = fn(x)
    del compiled
    torch._dynamo.reset()
    gc.collect()
    for _ in range(3):     # fresh allocations that would land in freed memory
        rand(4096, device=device).mul_(7)
    assert cudagraphs._retired
    assert_same(out, expected)


def test_expanded_input_changes_layout(device, graphs):
    """An input captured expanded (stride 0) is copied in one element per expanded dim
    (the whole tensor cannot be written); the same values dense give eager's result too
    (Dynamo recompiles for that layout; the runner would run such a call as compiled)."""
    def fn(x, y):
        return x * y + 1

    compiled = torch.compile(fn, backend="tritonfuse", mode="reduce-overhead")
    y = rand(8, 16, device=device)
    for _ in range(3):
        x = rand(8, 1, device=device).expand(8, 16)
        assert_same(compiled(x, y), fn(x, y))
    dense = rand(8, 1, device=device).expand(8, 16).contiguous()
    assert_same(compiled(dense, y), fn(dense, y))
    assert metrics.cudagraph_replays == 2
