"""The CUDA launch path without a GPU: launchers of compiled kernels (static sizes and
symbolic ones, per size bucket) take their binaries from the compile pool and launch them
through the binary's own launcher, never through the JIT's dispatch.

Here a "binary" is `InterpretedBinary`: the pool hands it out where it would hand out a
CompiledKernel, and its launcher runs the kernel in Triton's interpreter with the grid
and arguments it was given, so the results are checked against eager and the launches
(grid, arguments) and compiles are counted. tests/test_compile_pipeline.py runs the same
path on a real GPU."""
import pytest
import torch
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

import tritonfuse.config as tf_config
from common import kernel_count
from tritonfuse import metrics
from tritonfuse.codegen import registry
from tritonfuse.codegen.triton.scheduling import InterpretedTritonScheduling
from tritonfuse.runtime import async_compile, autotuner
from tritonfuse.runtime.dynamic_launcher import DynamicTritonLauncher
from tritonfuse.runtime.heuristics import Config
from tritonfuse.runtime.triton_launcher import TritonLauncher, _jit_calls_interpreted, _to_interpreted

from test_triton_launcher import REDUCTION
from warmup_targets import _ADD_SOURCE as ADD_SOURCE

ADD = ADD_SOURCE.replace("triton_poi_warmup_add_0", "triton_poi_direct_add_0")

# tests/test_triton_launcher.py's sum of sigmoids over rows, its row stride a size symbol
# s0 (an argument before the numels, as generated kernels of symbolic sizes take it)
ROW_SUM = REDUCTION.replace("out_ptr0, xnumel", "out_ptr0, s0, xnumel").replace("rnumel * xindex", "s0 * xindex")


def sigmoid_sum(x):
    return torch.sigmoid(x).sum(-1)


class InterpretedBinary:
    """Stands in for a CompiledKernel of `fn` for `config` and `argspec`: launched through
    `run` as a CompiledKernel is, it runs `fn` in Triton's interpreter."""

    def __init__(self, fn, config, argspec, launches):
        self.fn, self.config, self.argspec, self.launches = fn, config, argspec, launches
        self.function, self.packed_metadata = object(), object()
        self.constexprs = [p.name for p in fn.params if p.is_constexpr]

    @property
    def run(self):
        return self._launch

    def _launch(self, grid0, grid1, grid2, stream, function, packed, metadata, enter, exit_, *args):
        assert function is self.function and packed is self.packed_metadata
        assert self.argspec.matches(args[:len(self.argspec.args)]), "launched with arguments it does not fit"
        plain, constexprs = args[:-len(self.constexprs)], args[-len(self.constexprs):]
        assert dict(zip(self.constexprs, constexprs)) == self.config.kwargs
        self.launches.append(((grid0, grid1, grid2), plain[len(self.argspec.pointers()):]))
        with _jit_calls_interpreted():
            _to_interpreted(self.fn)[(grid0, grid1, grid2)](*plain, **self.config.kwargs)


class FakeCuda:
    """The driver calls a launch makes (device 0, stream 0)."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 0


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """The CUDA launch path on CPU tensors: compiles give InterpretedBinary, the JIT's
    dispatch fails, one candidate config (no benchmark)."""
    from triton.backends.compiler import GPUTarget
    compiled, launches = [], []

    def compile_kernel(fn, config, argspec, target):
        compiled.append((config, argspec))
        return InterpretedBinary(fn, config, argspec, launches)

    def no_jit(*args, **kwargs):
        raise AssertionError("took the JIT dispatch path")

    monkeypatch.setattr(driver, "_active", FakeCuda())
    monkeypatch.setattr(async_compile, "cuda_target", lambda index: GPUTarget("cuda", 90, 32))
    monkeypatch.setattr(async_compile, "compile_kernel", compile_kernel)
    monkeypatch.setattr(tf_config, "compile_workers", 0)      # compiles in the submitting thread
    monkeypatch.setattr(async_compile, "_pool", None)
    monkeypatch.setattr(JITFunction, "run", no_jit)
    monkeypatch.setattr(tf_config, "autotune", "none")
    autotuner.forget_all()
    yield compiled, launches
    autotuner.forget_all()


def test_static_kernel_launches_its_pool_binary(fake_gpu):
    compiled, launches = fake_gpu
    n = 1000
    launcher = TritonLauncher("triton_poi_direct_add_0", ADD, "pointwise", {"x": n}, [2], "cuda",
                              [Config({"XBLOCK": 256}, 4)], pointer_dtypes=(torch.float32,) * 3, device_index=0)
    assert len(compiled) == 1                        # compiling since the launcher was made
    for _ in range(3):
        a, b, out = torch.randn(n), torch.randn(n), torch.empty(n)
        launcher.run(a, b, out, n)
        torch.testing.assert_close(out, a + b)
    assert launcher.run.__name__ == "fast_launch" and len(compiled) == 1
    assert [grid for grid, _ in launches] == [(4, 1, 1)] * 3


def test_symbolic_kernel_launches_directly_after_each_buckets_first(fake_gpu):
    compiled, launches = fake_gpu
    launcher = DynamicTritonLauncher("triton_poi_direct_add_0", ADD, "pointwise", None, [2], "cuda",
                                     pointer_dtypes=(torch.float32,) * 3, device_index=0, example_scalars=(1000,))
    assert len(compiled) == 1                        # the example's bucket, compiling ahead

    def add(n):
        a, b, out = torch.randn(n), torch.randn(n), torch.empty(n)
        launcher.run(a, b, out, n)
        torch.testing.assert_close(out, a + b)

    add(1000)
    assert len(compiled) == 1                        # the binary compiled ahead
    (bucket,) = launcher.by_bucket.values()
    assert bucket.sized_launch.__name__ == "fast_launch"
    xblock = bucket.chosen_config.kwargs["XBLOCK"]
    for n in (1003, 517, 1021):                      # the bucket (513..1024), the class (n % 16 != 0)
        add(n)
    assert len(compiled) == 1 and len(launcher.by_bucket) == 1
    add(1008)                                        # divisible by 16: its own binary, compiled once
    add(1024)
    assert len(compiled) == 2 and compiled[1][1].args[-1] == 16
    add(300)                                         # another bucket: its configs, its binaries
    assert len(launcher.by_bucket) == 2
    launcher.run(torch.empty(0), torch.empty(0), torch.empty(0), 0)   # nothing to launch
    sizes = [1000, 1003, 517, 1021, 1008, 1024]
    assert [grid for grid, _ in launches[:6]] == [(-(-n // xblock), 1, 1) for n in sizes]
    assert [scalars for _, scalars in launches[:6]] == [(n,) for n in sizes]
    assert len(launches) == 7


def test_symbolic_reduction_with_a_size_argument(fake_gpu):
    """A size symbol before the numels; the grid follows x (not the last argument)."""
    compiled, launches = fake_gpu
    launcher = DynamicTritonLauncher("triton_red_fused_sigmoid_sum_0", ROW_SUM, "reduction", None, [1], "cuda",
                                     pointer_dtypes=(torch.float32,) * 2, device_index=0,
                                     example_scalars=(40, 70, 40))
    shapes = ((70, 40), (65, 37), (100, 33), (128, 64))     # one bucket: rows 65..128, lengths 33..64
    for rows, length in shapes:
        x, out = torch.randn(rows, length), torch.empty(rows)
        launcher.run(x, out, length, rows, length)
        torch.testing.assert_close(out, sigmoid_sum(x))
    (bucket,) = launcher.by_bucket.values()
    xblock = bucket.chosen_config.kwargs["XBLOCK"]
    assert [grid for grid, _ in launches] == [(-(-rows // xblock), 1, 1) for rows, _ in shapes]
    assert len(compiled) == 2                        # s0 = 40, 37, 33 | 64 (divisible by 16)


def test_misaligned_tensors_get_a_binary_of_their_own(fake_gpu):
    compiled, _ = fake_gpu
    launcher = DynamicTritonLauncher("triton_poi_direct_add_0", ADD, "pointwise", None, [2], "cuda",
                                     pointer_dtypes=(torch.float32,) * 3, device_index=0, example_scalars=(100,))
    a, b, out = torch.randn(101), torch.randn(100), torch.empty(100)
    launcher.run(a[:100], b, out, 100)
    launcher.run(a[1:], b, out, 100)                 # 4-byte aligned only
    torch.testing.assert_close(out, a[1:] + b)
    assert len(compiled) == 2 and not compiled[1][1].args[0].aligned
    launcher.run(a[1:], b, out, 100)
    assert len(compiled) == 2


# --- generated code, end to end ----------------------------------------------------------

class InterpretedAsCuda(InterpretedTritonScheduling):
    """Kernels spelled for the interpreter, defined and launched as compiled CUDA kernels
    are: compiled ahead through the pool, launched through the binaries."""
    launcher_device = "cuda"
    reports_zero_division = False

    @staticmethod
    def _device_index(device):
        return 0


@pytest.fixture
def generated_as_cuda(fake_gpu, monkeypatch):
    monkeypatch.setattr(tf_config, "cpu_backend", "cpp")
    monkeypatch.setitem(registry._backends, "cpu", InterpretedAsCuda)
    return fake_gpu


EYE = torch.eye(16)


def layers(x, w, eye=EYE):
    """Three identical layers (a matmul between them keeps their kernels apart; the
    identity is an input: torch.eye in the graph would be a kernel of its own)."""
    for _ in range(3):
        x = torch.softmax(torch.relu(x) * w, dim=-1) + 1.0
        x = x @ eye
    return x


def test_generated_kernels_compile_ahead_once_and_launch_directly(generated_as_cuda):
    compiled_binaries, launches = generated_as_cuda
    x, w = torch.randn(8, 16), torch.randn(16)
    compiled = torch.compile(layers, backend="tritonfuse")
    torch.testing.assert_close(compiled(x, w, EYE), layers(x, w, EYE))
    assert metrics.eager_graphs == 0 and kernel_count() == 3 and metrics.kernel_dedup_hits == 2
    assert len(compiled_binaries) == metrics.triton_compilations == 1   # one kernel, one config
    torch.testing.assert_close(compiled(x, w, EYE), layers(x, w, EYE))
    assert len(compiled_binaries) == 1 and len(launches) == 6


def test_generated_kernels_of_symbolic_sizes_launch_directly(generated_as_cuda):
    compiled_binaries, launches = generated_as_cuda
    w = torch.randn(16)
    compiled = torch.compile(layers, backend="tritonfuse", dynamic=True)
    x = torch.randn(10, 16)
    torch.testing.assert_close(compiled(x, w, EYE), layers(x, w, EYE))
    assert metrics.eager_graphs == 0 and metrics.symbolic_graphs == 1 and metrics.kernel_dedup_hits == 2
    compiles = len(compiled_binaries)
    assert compiles == metrics.triton_compilations == 1          # compiled ahead, for 10 rows
    for rows in (15, 9):                         # the bucket of 10 rows, the class of its sizes
        x = torch.randn(rows, 16)
        torch.testing.assert_close(compiled(x, w, EYE), layers(x, w, EYE))
    assert len(compiled_binaries) == compiles and len(launches) == 9
    x = torch.randn(3, 16)                       # another bucket
    torch.testing.assert_close(compiled(x, w, EYE), layers(x, w, EYE))


def test_generated_kernels_take_host_scalars(generated_as_cuda, monkeypatch):
    """A 0-d CPU input read on the host reaches the kernels as a float argument: no example
    value to compile ahead for, so the first launch compiles, and every later value of it
    uses that binary (floats are one class)."""
    from tritonfuse.graph import GraphLowering
    compiled_binaries, _ = generated_as_cuda
    monkeypatch.setattr(GraphLowering, "_is_host_scalar", lambda self, t: t.dim() == 0 and t.device.type == "cpu")

    def fn(x, scale):
        return (scale * x).sin().sum(-1) + scale

    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    with torch.no_grad():
        for value in (3.0, -2.5, 0.5):
            x, scale = torch.randn(5, 16), torch.tensor(value)
            torch.testing.assert_close(compiled(x, scale), fn(x, scale))
    assert metrics.eager_graphs == 0 and len(compiled_binaries) == 1


def test_sizes_seen_before_skip_the_checks_but_keep_their_grid(fake_gpu, monkeypatch):
    """The integer arguments are classified, and the grid computed, once per distinct set:
    repeated sizes look both up; sizes of another class still get their own binary."""
    from tritonfuse.runtime import direct_launch
    compiled, launches = fake_gpu
    classified = []

    def counting_scalar_class(value):
        classified.append(value)
        return async_compile.scalar_class(value)
    monkeypatch.setattr(direct_launch, "scalar_class", counting_scalar_class)
    launcher = DynamicTritonLauncher("triton_poi_direct_add_0", ADD, "pointwise", None, [2], "cuda",
                                     pointer_dtypes=(torch.float32,) * 3, device_index=0, example_scalars=(1000,))
    sizes = [1000, 1003, 1000, 1003, 1000, 1008, 1008, 1003]
    for n in sizes:
        a, b, out = torch.randn(n), torch.randn(n), torch.empty(n)
        launcher.run(a, b, out, n)
        torch.testing.assert_close(out, a + b)
    # 1000: by the bucket's first launch and its later one; 1008: by the first binary's
    # launch (it does not fit) and by the launch of its own binary
    assert classified.count(1000) == 2 and classified.count(1003) == 1 and classified.count(1008) == 2
    assert len(compiled) == 2                        # 1008 (divisible by 16): its own binary
    xblock = launcher.by_bucket[(10,)].chosen_config.kwargs["XBLOCK"]
    assert [grid for grid, _ in launches] == [(-(-n // xblock), 1, 1) for n in sizes]
