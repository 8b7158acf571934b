"""Training through aot_autograd, the backend entry point, caching and observability."""
import os
import subprocess
import sys
import textwrap

import torch

import tritonfuse
from common import check, rand


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(12, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.fc2 = torch.nn.Linear(32, 5)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.norm(self.fc1(x))))


def _train(model, x, y, steps, compiled):
    step_model = torch.compile(model, backend="tritonfuse") if compiled else model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(step_model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, [p.grad.clone() for p in model.parameters()]


def test_mlp_training_matches_eager(device):
    torch.manual_seed(0)
    eager_model = MLP().to(device)
    compiled_model = MLP().to(device)
    compiled_model.load_state_dict(eager_model.state_dict())
    x = torch.randn(16, 12, device=device)
    y = torch.randint(0, 5, (16,), device=device)
    eager_losses, eager_grads = _train(eager_model, x, y, 4, compiled=False)
    losses, grads = _train(compiled_model, x, y, 4, compiled=True)
    assert tritonfuse.metrics.eager_graphs == 0
    assert tritonfuse.metrics.generated_kernel_count > 0
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(eager_losses), atol=1e-5, rtol=1e-5)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-4)


def test_no_grad_and_inference(device):
    model = MLP().to(device)
    x = torch.randn(4, 12, device=device)
    with torch.no_grad():
        check(model, x, atol=1e-5, rtol=1e-4)


def test_input_with_unexpected_layout_is_restrided(device):
    compiled = torch.compile(lambda a: a * 2 + 1, backend="tritonfuse")
    x = rand(6, 4, device=device)
    torch.testing.assert_close(compiled(x), x * 2 + 1)
    from tritonfuse.runtime.wrapper_helpers import ensure_layout
    odd = rand(4, 6, device=device).t()
    fixed = ensure_layout(odd, (6, 4), (4, 1))
    assert fixed.stride() == (4, 1)
    torch.testing.assert_close(fixed, odd)


def test_cpu_allocation_fast_path():
    from tritonfuse.runtime.wrapper_helpers import empty_strided_cpu
    t = empty_strided_cpu((3, 4), (1, 3), torch.bfloat16)
    assert (t.shape, t.stride(), t.dtype, t.device.type) == ((3, 4), (1, 3), torch.bfloat16, "cpu")


def test_reinterpret_tensor_offsets_are_relative_to_the_view():
    from tritonfuse.runtime.wrapper_helpers import reinterpret_tensor
    base = torch.arange(100.0)[10:]
    view = reinterpret_tensor(base, (3, 4), (1, 3), 5)
    assert (view.storage_offset(), view.stride()) == (15, (1, 3))
    torch.testing.assert_close(view, torch.as_strided(base, (3, 4), (1, 3), 15))


def _run_python(code, env_extra, cwd):
    env = dict(os.environ, **env_extra)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                            cwd=cwd, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


SCRIPT = """
    import torch
    # note: no `import tritonfuse`: the entry point registers the backend
    fn = torch.compile(lambda a, b: torch.softmax(a * b, -1), backend="tritonfuse")
    x = torch.randn(4, 16)
    out = fn(x, x)
    torch.testing.assert_close(out, torch.softmax(x * x, -1))
    import tritonfuse
    print("kernels", tritonfuse.metrics.generated_kernel_count, "hits", tritonfuse.metrics.graph_cache_hits)
"""


def test_entry_point_and_graph_cache_in_new_process(tmp_path):
    env = {"TRITONFUSE_CACHE_DIR": str(tmp_path), "TRITONFUSE_CPU_BACKEND": os.environ.get(
        "TRITONFUSE_CPU_BACKEND", tritonfuse.config.cpu_backend)}
    first = _run_python(SCRIPT, env, str(tmp_path))
    assert "kernels 1 hits 0" in first, first
    second = _run_python(SCRIPT, env, str(tmp_path))
    assert "kernels 0 hits 1" in second, second


def test_debug_env_writes_generated_code(tmp_path):
    env = {"TRITONFUSE_CACHE_DIR": str(tmp_path), "TRITONFUSE_DEBUG": "1", "TRITONFUSE_CPU_BACKEND": "triton"}
    out = _run_python(SCRIPT, env, str(tmp_path))
    line = next(l for l in out.splitlines() if "written to" in l)
    folder = line.split("written to ")[1].strip()
    files = os.listdir(folder)
    assert "wrapper.py" in files and any(f.startswith("triton_") for f in files), files


def test_metrics_reset():
    tritonfuse.metrics.generated_kernel_count = 3
    tritonfuse.metrics.fallbacks["x"] = "y"
    tritonfuse.metrics.reset()
    assert tritonfuse.metrics.generated_kernel_count == 0 and not tritonfuse.metrics.fallbacks


def test_compile_failure_runs_eagerly_and_is_logged(device, monkeypatch, caplog):
    from tritonfuse import compile_fx

    def broken(*args, **kwargs):
        raise RuntimeError("simulated compiler bug")
    monkeypatch.setattr(compile_fx, "schedule", broken)
    monkeypatch.setattr(tritonfuse.config, "graph_cache", False)   # no graph of an earlier test
    x = rand(3, 3, device=device)
    out = torch.compile(lambda a: a.sin() + 1, backend="tritonfuse")(x)
    torch.testing.assert_close(out, x.sin() + 1)
    assert tritonfuse.metrics.eager_graphs == 1
    assert "simulated compiler bug" in caplog.text


def test_graph_key_covers_the_code_of_the_backend_that_generates(monkeypatch):
    """Editing cpu_backend (a package outside tritonfuse) must not reuse stale wrappers."""
    import cpu_backend
    from tritonfuse import code_cache

    gm = torch.fx.symbolic_trace(lambda a: a + 1)
    x = torch.randn(4)
    monkeypatch.setattr(tritonfuse.config, "cpu_backend", "cpp")
    before = code_cache.graph_key(gm, [x])
    backend_root = os.path.dirname(os.path.abspath(cpu_backend.__file__))
    monkeypatch.setitem(code_cache._fingerprints, backend_root, "edited")
    assert code_cache.graph_key(gm, [x]) != before


def test_graph_key_covers_the_cpu_thread_count(monkeypatch):
    """C++ kernels are generated for torch's thread count: another count compiles anew."""
    from tritonfuse import code_cache

    gm = torch.fx.symbolic_trace(lambda a: a + 1)
    x = torch.randn(4)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    two = code_cache.graph_key(gm, [x])
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    assert code_cache.graph_key(gm, [x]) != two
