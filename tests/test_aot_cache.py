"""Warm starts through the aot cache (tritonfuse/aot_cache.py): a second process that meets
the same Dynamo graphs loads aot_autograd's result from the disk instead of tracing and
partitioning again, and must compute what eager computes: outputs, gradients, mutated
inputs (batch norm's running statistics), outputs that alias inputs, a tensor passed twice,
constants made in the graph.
Graphs the cache does not keep (symbolic sizes) and an entry whose compiled graph is gone
take the normal compile, with the right answer and no graph run eagerly.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

RUNNER = r'''
import json
import torch
import tritonfuse
from tritonfuse import metrics

torch.manual_seed(0)
problems = []


def check(what, got, want, **tolerances):
    try:
        torch.testing.assert_close(got, want, **tolerances)
    except AssertionError as error:
        problems.append(f"{what}: {error}")


def training_step():   # forward and backward graphs
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64),
                                torch.nn.Linear(64, 8))
    x = torch.randn(16, 32)
    out = torch.compile(model, backend="tritonfuse")(x)
    out.square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    want = model(x)
    want.square().mean().backward()
    check("training output", out, want)
    for got, p in zip(grads, model.parameters()):
        check("gradient", got, p.grad)


def batch_norm_training():   # inputs mutated in the graph: the running statistics
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    reference = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    reference.load_state_dict(model.state_dict())
    x = torch.randn(4, 3, 10, 10)
    out = torch.compile(model, backend="tritonfuse")(x)
    out.sum().backward()
    want = reference(x)
    want.sum().backward()
    check("batch norm output", out, want)
    check("running mean", model[1].running_mean, reference[1].running_mean)
    check("running var", model[1].running_var, reference[1].running_var)
    # (a sum over 4x8x8 positions in another order than eager's: float32 rounding)
    check("conv weight gradient", model[0].weight.grad, reference[0].weight.grad, atol=1e-4, rtol=1e-4)


def aliases(a, b):   # an output that is a view of an input; an input mutated
    b.add_(1)
    return a.t(), torch.tanh(a @ b) + a.sum()


def inference_with_aliases():
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    a2, b2 = a.clone(), b.clone()
    with torch.no_grad():
        view, value = torch.compile(aliases, backend="tritonfuse")(a, b)
    want_view, want_value = aliases(a2, b2)
    check("aliasing output", view, want_view)
    check("value", value, want_value)
    check("mutated input", b, b2)
    a[0, 1] = 100.0
    if view[1, 0].item() != 100.0:
        problems.append("the output is no longer a view of its input")


def twice(x, y):
    return torch.sigmoid(x) * y + x


def same_tensor_twice():   # aot_autograd de-duplicates the inputs
    x = torch.randn(32, requires_grad=True)
    out = torch.compile(twice, backend="tritonfuse")(x, x)
    out.sum().backward()
    grad = x.grad.clone()
    x.grad = None
    want = twice(x, x)
    want.sum().backward()
    check("duplicated input", out, want)
    check("duplicated input gradient", grad, x.grad)


def with_constants(x):
    mask = torch.tensor([[0.0, float("-inf")] * 4])   # tensors made in the graph: its constants
    return torch.softmax(x + mask, -1) * torch.tensor(2.5) + torch.arange(8.0)


def inference_with_constants():
    x = torch.randn(4, 8)
    with torch.no_grad():
        check("graph with constants", torch.compile(with_constants, backend="tritonfuse")(x), with_constants(x))


def symbolic_sizes():   # not kept: the normal compile every time
    f = torch.compile(lambda x: torch.relu(x) * 2, backend="tritonfuse", dynamic=True)
    for n in (5, 7):
        x = torch.randn(n)
        check("symbolic", f(x), torch.relu(x) * 2)


for scenario in (training_step, batch_norm_training, inference_with_aliases, same_tensor_twice,
                 inference_with_constants, symbolic_sizes):
    torch._dynamo.reset()
    scenario()
print(json.dumps({"problems": problems, "aot_cache_hits": metrics.aot_cache_hits,
                  "eager_graphs": metrics.eager_graphs, "cache_repairs": metrics.cache_repairs}))
'''


def _run(cache, root):
    script = os.path.join(root, "runner.py")
    with open(script, "w") as f:
        f.write(RUNNER)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TRITONFUSE_CACHE_DIR=cache, TRITONFUSE_AUTOTUNE_CACHE_DIR=os.path.join(root, "autotune"),
               TRITONFUSE_CPU_BACKEND="cpp")
    env.pop("TRITONFUSE_GRAPH_CACHE", None)
    done = subprocess.run([sys.executable, script], cwd=root, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["problems"] == [], report["problems"]
    assert report["eager_graphs"] == 0, done.stderr[-3000:]
    return report


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("aot_cache"))
    cache = os.path.join(root, "cache")
    cold = _run(cache, root)
    assert cold["aot_cache_hits"] == 0
    return root, cache


def test_second_process_loads_aot_results_and_matches_eager(warm_cache):
    root, cache = warm_cache
    warm = _run(cache, root)
    # the training step, batch norm, the aliasing inference, the duplicated input, the graph
    # with constants; symbolic sizes never
    assert warm["aot_cache_hits"] == 5, warm
    assert warm["cache_repairs"] == 0


def test_entry_whose_graphs_are_gone_compiles_again(warm_cache, tmp_path):
    root, cache = warm_cache
    copy = str(tmp_path / "cache")
    shutil.copytree(cache, copy)
    shutil.rmtree(os.path.join(copy, "graphs"))
    report = _run(copy, str(tmp_path))
    assert report["aot_cache_hits"] == 0
    again = _run(copy, str(tmp_path))    # the compile wrote graphs and entries afresh
    assert again["aot_cache_hits"] == 5, again


def _key(fn, *inputs):
    import torch
    from tritonfuse import aot_cache
    from tritonfuse.compile_options import CompileOptions
    return aot_cache.key_for(torch.fx.symbolic_trace(fn), list(inputs), CompileOptions())


def test_key_tells_apart_what_changes_aot_autograds_result():
    import torch

    def f(x, y):
        return torch.sigmoid(x) * y

    x, y = torch.randn(8, 8), torch.randn(8, 8)
    key = _key(f, x, y)
    assert key is not None and key == _key(f, x.clone(), y.clone())
    assert key != _key(f, x.requires_grad_(), y)          # a training graph, not inference
    x = x.detach()
    assert key != _key(f, x, x)                            # one tensor passed twice
    assert key != _key(f, x.t(), y)                        # strides
    assert key != _key(f, torch.randn(16, 8)[::2], y)      # a view with other strides
    with torch.no_grad():
        assert key != _key(f, x, y)                        # grad mode
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert key != _key(f, x, y)                        # autocast
    threads = torch.get_num_threads()
    try:   # C++ kernels are generated for a thread count: an entry must not cross counts
        torch.set_num_threads(threads + 1)
        assert key != _key(f, x, y)
    finally:
        torch.set_num_threads(threads)


def test_graphs_with_state_or_symbols_are_not_kept():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext
    from tritonfuse import aot_cache
    from tritonfuse.compile_options import CompileOptions
    double = torch.fx.symbolic_trace(lambda x: x * 2)
    assert aot_cache.key_for(double, [torch.randn(4)], CompileOptions()) is not None
    assert aot_cache.key_for(double, [torch.randn(4)], CompileOptions(cudagraphs=True)) is None
    model = torch.fx.symbolic_trace(torch.nn.Linear(4, 4))   # holds its parameters
    assert aot_cache.key_for(model, [torch.randn(2, 4)], CompileOptions()) is None
    mode = FakeTensorMode(shape_env=ShapeEnv())
    context = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.DYNAMIC])
    symbolic = mode.from_tensor(torch.randn(4, 3), symbolic_context=context)
    assert aot_cache.key_for(double, [symbolic], CompileOptions()) is None


def test_broken_graph_under_a_loaded_entry_keeps_the_layouts_its_backward_expects(monkeypatch, tmp_path):
    """A forward graph loaded through an entry fails on its first call: it is compiled
    again outside aot_autograd, where the channels_last choices the cached backward was
    compiled for are unknown (its outputs are copied into the strides recorded for them),
    and the training step still matches eager; the entry is deleted."""
    import glob
    import pickle
    import torch
    from tritonfuse import cache_store, code_cache, config, metrics
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    monkeypatch.setattr(config, "layout_opt", "1")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3))
    x = torch.randn(2, 3, 12, 12)

    def step(fn):
        model.zero_grad()
        out = fn(x)
        out.square().sum().backward()
        return out, [p.grad.clone() for p in model.parameters()]

    want = step(model)
    step(torch.compile(model, backend="tritonfuse"))
    [entry_file] = glob.glob(str(tmp_path / "aot" / "*" / "a*.pkl"))
    forward_key = pickle.loads(cache_store.read(entry_file))["graphs"]["forward"][0]
    module = code_cache.module_path(forward_key)
    assert code_cache.read_entry(forward_key)[1]["output_strides"]   # channels_last outputs reported
    cache_store.write(module, open(module).read() + "\n\ndef call(args):\n    raise RuntimeError('a broken kernel')\n")
    torch._dynamo.reset()
    metrics.reset()
    got = step(torch.compile(model, backend="tritonfuse"))
    assert metrics.aot_cache_hits == 1 and metrics.eager_graphs == 0
    torch.testing.assert_close(got[0], want[0], atol=1e-4, rtol=1e-4)
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert not glob.glob(str(tmp_path / "aot" / "*" / "a*.pkl"))     # the next process compiles afresh


def test_graph_keys_hold_the_contents_of_constants(monkeypatch):
    """A graph's constants are read by its generated code at run time and taken from the
    graph on a cache hit: the graph cache key holds their contents, and constants too
    large to hash at every compile leave the graph out of the cache."""
    import torch
    from tritonfuse import code_cache

    def graph_with(value):
        gm = torch.fx.symbolic_trace(lambda x: x + 1)
        gm.register_buffer("_tensor_constant0", value, persistent=False)
        x = next(n for n in gm.graph.nodes if n.op == "placeholder")
        with gm.graph.inserting_after(x):
            const = gm.graph.get_attr("_tensor_constant0")
        out = next(n for n in gm.graph.nodes if n.op == "output")
        with gm.graph.inserting_before(out):
            total = gm.graph.call_function(torch.add, (out.args[0], const))
        out.args = (total,)
        gm.recompile()
        return gm

    def key(gm):
        fingerprint = code_cache.constants_fingerprint(gm)
        return None if fingerprint is None else code_cache.graph_key(gm, [torch.randn(4)], extra=[fingerprint])

    one = torch.ones(4)
    assert key(graph_with(one)) == key(graph_with(one.clone()))
    assert key(graph_with(one)) != key(graph_with(one * 2))                 # other contents
    assert key(graph_with(one)) != key(graph_with(one.double()))            # another dtype
    assert code_cache.constants_fingerprint(torch.fx.symbolic_trace(lambda x: x + 1)) == []
    monkeypatch.setattr(code_cache, "MAX_HASHED_CONSTANT_BYTES", 8)
    assert code_cache.constants_fingerprint(graph_with(one)) is None
