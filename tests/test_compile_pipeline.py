"""The compile pipeline: identical kernels defined and compiled once, the compile pool
(threads and worker processes) whose binaries the launches use, and the autotuning
budget. Binaries are built for an H100 (sm_90) offline: no GPU needed for that part."""
import json
import os
import pathlib
import pickle
import re
import subprocess
import sys
import threading
import time

import pytest
import torch

from common import check, kernel_count
from warmup_targets import _ADD_SOURCE as ADD_SOURCE
import tritonfuse.config as tf_config
from tritonfuse import metrics
from tritonfuse.runtime import async_compile, autotuner
from tritonfuse.runtime.async_compile import ArgSpec, CompilePool, KernelSource, Pointer
from tritonfuse.runtime.heuristics import TUNE_MIN_ELEMENTS, Config, candidate_configs
from tritonfuse.runtime.triton_launcher import TritonLauncher

HAS_CUDA = torch.cuda.is_available()
SM90 = None   # GPUTarget("cuda", 90, 32), made lazily (imports triton)

def add_kernel(name):
    """out = x + y (the hand-written kernel of tests/warmup_targets.py), called `name`."""
    return KernelSource(name, ADD_SOURCE.replace("triton_poi_warmup_add_0", name))


def sm90():
    global SM90
    if SM90 is None:
        from triton.backends.compiler import GPUTarget
        SM90 = GPUTarget("cuda", 90, 32)
    return SM90


@pytest.fixture
def fresh_pool(monkeypatch, tmp_path):
    """A compile pool of its own (no binaries from other tests) and its own Triton cache."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(async_compile, "_pool", None)
    autotuner.forget_all()
    yield
    if async_compile._pool is not None:
        async_compile._pool.close()
    autotuner.forget_all()


def layers(x, w, eye):
    for _ in range(4):
        x = torch.relu(x) * w + 1.0
        x = x @ eye   # (an input: torch.eye in the graph would be a kernel of its own)
    return x


# --- one definition per kernel ------------------------------------------------------------

def test_identical_layers_define_one_kernel(device, fresh_pool):
    x, w = torch.randn(32, 64, device=device), torch.randn(64, device=device)
    sources = check(layers, x, w, torch.eye(64, device=device))
    wrapper = sources[0]
    # four launches of two kernels: the first layer reads the input, the other three write
    # in place over the mm output they read (memory planning)
    assert kernel_count() == 4
    assert metrics.kernel_dedup_hits == 2
    assert len(sources) == 3
    calls = re.findall(r"^\s+(\w+)(?:\.run)?\((?:arg|buf)", wrapper, re.M)
    assert len(calls) == 4 and len(set(calls)) == 2 and len(set(calls[1:])) == 1, calls
    if device == "cuda":                          # one compile per candidate config
        assert metrics.triton_compilations == 2 * len(candidate_configs("pointwise", {"x": 32 * 64}))


def test_cpp_library_holds_one_body_per_form_for_identical_layers(device):
    if device != "cpu" or tf_config.cpu_backend != "cpp":
        pytest.skip("the C++ backend")
    x, w = torch.randn(32, 64), torch.randn(64)
    sources = check(layers, x, w, torch.eye(64))
    # one body out of place (the first layer reads the input), one in place (the others)
    assert len(re.findall(r'extern "C" void cpp_fused\w*\(', sources[0])) == 2
    assert len(re.findall(r"^\s+cpp_fused\w+\(\w+\.data_ptr\(\)", sources[0], re.M)) == 4


def test_kernels_that_differ_are_all_defined(device, fresh_pool):
    def f(x, w):
        return torch.relu(x) * w, torch.sigmoid(x) * w, torch.relu(x.t()) * w
    x, w = torch.randn(64, 64, device=device), torch.randn(64, device=device)
    sources = check(f, x, w)
    assert metrics.kernel_dedup_hits == 0 and len(sources) - 1 == kernel_count()


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_identical_kernels_of_two_graphs_compile_once(fresh_pool):
    x = torch.randn(64, 64, device="cuda")
    check(lambda t: torch.relu(t) * 3.0, x)
    compiled = metrics.triton_compilations
    assert compiled >= 1 and metrics.kernel_dedup_hits == 0
    check(lambda t, m: (torch.relu(t) * 3.0) @ m, x, x)     # another graph, the same kernel
    assert metrics.triton_compilations == compiled and metrics.kernel_dedup_hits == 1


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_launch_uses_the_pool_binaries(fresh_pool):
    n = 5000
    kernel = add_kernel("triton_poi_pool_add_0")
    configs = [Config({"XBLOCK": 256}, 2), Config({"XBLOCK": 1024}, 4)]
    launcher = TritonLauncher(kernel.name, kernel.source, "pointwise", {"x": n}, [2], "cuda", configs,
                              pointer_dtypes=(torch.float32,) * 3, device_index=torch.cuda.current_device())
    pooled = {cfg: f.result() for cfg, f in launcher._binaries[2].items()}
    a, b, out = (torch.randn(n, device="cuda") for _ in range(3))
    launcher.run(a, b, out, n)
    torch.testing.assert_close(out, a + b)
    assert launcher.run.__name__ == "fast_launch"
    assert launcher._binaries[2][launcher.chosen_config].result() is pooled[launcher.chosen_config]
    assert metrics.triton_compilations == 2


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_a_pool_binarys_first_launch_builds_no_launcher(fresh_pool, monkeypatch):
    """Loading a binary from the pool at its first launch runs no C compiler: the pool
    built its signature's launcher ahead (Triton 3.6), or this Triton needs none."""
    from triton.runtime import build
    n = 4096
    kernel = add_kernel("triton_poi_prebuilt_add_0")
    configs = [Config({"XBLOCK": 512}, 4)]
    launcher = TritonLauncher(kernel.name, kernel.source, "pointwise", {"x": n}, [2], "cuda", configs,
                              pointer_dtypes=(torch.float32,) * 3, device_index=torch.cuda.current_device())
    a, b, out = (torch.randn(n, device="cuda") for _ in range(3))
    launcher.run(a, b, out, n)                 # loads the driver, whatever it builds
    for f in launcher._binaries[2].values():
        f.result()
    other = add_kernel("triton_poi_prebuilt_add_1").source.replace("tmp0 + tmp1", "tmp0 * tmp1")
    launcher = TritonLauncher("triton_poi_prebuilt_add_1", other, "pointwise", {"x": n}, [2], "cuda", configs,
                              pointer_dtypes=(torch.float16,) * 3, device_index=torch.cuda.current_device())
    for f in launcher._binaries[2].values():
        f.result()

    def no_compiler(*args, **kwargs):
        raise AssertionError("a C compiler ran at a launch")

    monkeypatch.setattr(build, "_build", no_compiler)
    h = [t.half() for t in (a, b, out)]
    launcher.run(*h, n)
    torch.testing.assert_close(h[2], h[0] * h[1])


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_symbolic_kernels_launch_their_binaries_after_each_buckets_first(fresh_pool, monkeypatch):
    """A graph of symbolic sizes: after a bucket's first call its launches skip the JIT's
    dispatch (tests/test_direct_launch.py checks the launches themselves), and sizes of
    another class (divisible by 16) compile one more binary."""
    from triton.runtime.jit import JITFunction

    def fn(x):
        return torch.relu(x) * 2.0 + 1.0

    def no_jit(*args, **kwargs):
        raise AssertionError("took the JIT dispatch path")

    compiled = torch.compile(fn, backend="tritonfuse", dynamic=True)
    x = torch.randn(1000, device="cuda")
    torch.testing.assert_close(compiled(x), fn(x))
    assert metrics.symbolic_graphs == 1
    compilations = metrics.triton_compilations
    with monkeypatch.context() as m:
        m.setattr(JITFunction, "run", no_jit)
        for n in (1003, 517, 1021):              # the first call's bucket and class
            x = torch.randn(n, device="cuda")
            torch.testing.assert_close(compiled(x), fn(x))
    assert metrics.triton_compilations == compilations
    x = torch.randn(1008, device="cuda")          # divisible by 16: one more binary
    torch.testing.assert_close(compiled(x), fn(x))
    assert metrics.triton_compilations == compilations + 1


# --- the pool ----------------------------------------------------------------------------

def test_argspec_matches_what_the_binary_assumes():
    spec = ArgSpec.aligned([torch.float32, torch.float16], [4096, 1])
    assert spec.args == (Pointer(torch.float32, True), Pointer(torch.float16, True), 16, 1)
    x = torch.zeros(64)
    assert spec.matches([x, x.half(), 4096, 1])
    assert spec.matches([x, x.half(), 48, 1])                 # another size of the class
    assert not spec.matches([x[1:], x.half(), 4096, 1])      # 4-byte aligned only
    assert not spec.matches([x, x, 4096, 1])                  # another dtype
    assert not spec.matches([x, x.half(), 4097, 1])           # not divisible by 16
    assert not spec.matches([x, x.half(), 4096, 2])           # 1 is compiled in as a constant
    assert not spec.matches([x, x.half(), 1 << 36, 1])        # a 64-bit integer
    assert not spec.matches([x, x.half(), 4096])
    loose = ArgSpec.of_args([x[1:], x.half(), 7])
    assert loose.args == (Pointer(torch.float32, False), Pointer(torch.float16, True), 17)
    assert loose.matches([x[3:], x.half(), 9]) and loose.matches([x, x.half(), 7])


SCALARS = [0, 1, 2, 15, 16, 17, 48, 4097, -1, -16, (1 << 31) - 16, (1 << 31) - 1, 1 << 31, (1 << 31) + 1,
           -(1 << 31), -(1 << 31) - 1, 1 << 40, (1 << 40) + 3, (1 << 63) - 16, 1 << 63, (1 << 63) + 5, 0.5, -3.0]


def test_scalar_classes_are_the_jits_specializations():
    """Values of one scalar_class are exactly the values Triton's JIT specializes alike,
    and the class's representative specializes as they do (this triton's own function)."""
    from triton._C.libtriton import native_specialize_impl
    from triton.compiler import make_backend
    backend = make_backend(sm90())

    def specialization(value):
        return native_specialize_impl(backend, value, False, True, True)

    for value in SCALARS:
        assert specialization(async_compile.scalar_class(value)) == specialization(value), value
    for a in SCALARS:
        for b in SCALARS:
            same_class = async_compile.scalar_class(a) == async_compile.scalar_class(b)
            assert same_class == (specialization(a) == specialization(b)), (a, b)


def test_identical_kernels_compile_once_offline(fresh_pool):
    """Two names, one body: one compile; the binary is a real sm_90 cubin, specialized as
    Triton's JIT would be (aligned pointers and sizes divisible by 16; a size of 1 constant)."""
    pool = CompilePool(workers=0)
    argspec = ArgSpec.aligned([torch.float32] * 3, [4096])
    cfg = Config({"XBLOCK": 1024}, 4)
    first, existed = pool.submit(add_kernel("triton_poi_fused_add_0"), [cfg], argspec, sm90())
    assert not existed and metrics.triton_compilations == 1
    second, existed = pool.submit(add_kernel("triton_poi_fused_add_7"), [cfg], argspec, sm90())
    assert existed and metrics.triton_compilations == 1
    binary = first[cfg].result()
    assert second[cfg].result() is binary
    assert binary.asm["cubin"] and binary.metadata.num_warps == 4
    assert binary.src.attrs[(0,)] == [["tt.divisibility", 16]]
    assert binary.src.attrs[(3,)] == [["tt.divisibility", 16]]
    odd = ArgSpec((Pointer(torch.float32, False), Pointer(torch.float32, True), Pointer(torch.float32, True), 1))
    other, _ = pool.submit(add_kernel("triton_poi_fused_add_0"), [cfg], odd, sm90())
    assert metrics.triton_compilations == 2
    src = other[cfg].result().src
    assert src.attrs[(0,)] == [] and src.signature["xnumel"] == "constexpr" and src.constants[(3,)] == 1


class _RecordingLauncher:
    """Stands in for Triton 3.6's per-signature CUDA launcher: records what it is built for."""
    built = []

    def __init__(self, src, metadata):
        type(self).built.append(tuple(src.signature.values()))


def test_the_pool_builds_each_signatures_launcher_ahead_once(fresh_pool, monkeypatch):
    """On a Triton that builds a C launcher per kernel signature at a binary's first load,
    the pool builds it once per signature after the compile, off the thread that runs the
    graph; binaries that are only compiled (no device to load on) get none."""
    monkeypatch.setattr(async_compile, "_per_signature_launcher", lambda: _RecordingLauncher)
    monkeypatch.setattr(async_compile, "_launchers_built", {})
    monkeypatch.setattr(_RecordingLauncher, "built", [])
    pool = CompilePool(workers=0)
    argspec = ArgSpec.aligned([torch.float32] * 3, [4096])
    configs = [Config({"XBLOCK": 1024}, 4), Config({"XBLOCK": 512}, 2)]
    futures, _ = pool.submit(add_kernel("triton_poi_launch_add_0"), configs, argspec, sm90(), 0)
    assert all(futures[c].result().asm["cubin"] for c in configs)
    assert _RecordingLauncher.built == [("*fp32", "*fp32", "*fp32", "i32", "constexpr")]
    odd = ArgSpec.aligned([torch.float32] * 3, [1])
    pool.submit(add_kernel("triton_poi_launch_add_0"), configs[:1], odd, sm90(), 0)
    pool.submit(add_kernel("triton_poi_compile_only_0"), configs[:1], ArgSpec.aligned([torch.float16] * 3, [4096]),
                sm90())
    assert _RecordingLauncher.built == [("*fp32", "*fp32", "*fp32", "i32", "constexpr"),
                                        ("*fp32", "*fp32", "*fp32", "constexpr", "constexpr")]


class _SlowLauncher:
    """A launcher build that takes a while."""
    finished = []

    def __init__(self, src, metadata):
        time.sleep(0.5)
        type(self).finished.append(tuple(src.signature.values()))


def test_binaries_of_one_signature_wait_for_its_launcher(fresh_pool, monkeypatch):
    """Two configs of one kernel compile at once on two pool threads: one builds the
    launcher, and the other's binary is handed over only once that build has finished."""
    monkeypatch.setattr(async_compile, "_per_signature_launcher", lambda: _SlowLauncher)
    monkeypatch.setattr(async_compile, "_launchers_built", {})
    monkeypatch.setattr(_SlowLauncher, "finished", [])
    pool = CompilePool(workers=2)
    try:
        configs = [Config({"XBLOCK": 1024}, 4), Config({"XBLOCK": 512}, 2)]
        futures, _ = pool.submit(add_kernel("triton_poi_slow_launch_0"), configs,
                                 ArgSpec.aligned([torch.float32] * 3, [4096]), sm90(), 0)
        seen = []
        for cfg in configs:
            futures[cfg].add_done_callback(lambda f: seen.append(len(_SlowLauncher.finished)))
        for cfg in configs:
            futures[cfg].result(timeout=300)
        assert len(_SlowLauncher.finished) == 1 and seen == [1, 1]
    finally:
        pool.close()


def test_a_forked_child_forgets_launchers_still_building(fresh_pool, monkeypatch):
    """A launcher that a pool thread of the parent was building at a fork is never finished
    in the child: the child builds it again rather than waiting for it."""
    import threading as _threading
    built, building = _threading.Event(), _threading.Event()
    built.set()
    monkeypatch.setattr(async_compile, "_launchers_built", {("*fp32",): built, ("*fp16",): building})
    monkeypatch.setattr(async_compile, "_launchers_lock", async_compile._launchers_lock)
    async_compile._after_fork_in_child()
    assert async_compile._launchers_built == {("*fp32",): built}


def test_failed_compile_is_reported_to_the_waiter(fresh_pool):
    pool = CompilePool(workers=1)
    argspec = ArgSpec.aligned([torch.float32] * 3, [100])
    futures, _ = pool.submit(add_kernel("triton_poi_bad_0"), [Config({"XBLOCK": 3}, 1)], argspec, sm90())
    with pytest.raises(Exception, match="power of 2"):
        futures[Config({"XBLOCK": 3}, 1)].result(timeout=300)
    pool.close()


def test_worker_process_compiles_into_the_cache_this_process_loads(fresh_pool, tmp_path):
    """A worker process builds the binary; the pool then finds it in Triton's cache, so
    the launch uses exactly what the worker built."""
    from triton import knobs
    from tritonfuse.runtime.async_compile import compile_request
    from tritonfuse.runtime.compile_workers import WorkerProcess
    from tritonfuse.runtime.kernel_modules import load_kernel
    kernel = add_kernel("triton_poi_worker_add_0")
    argspec, cfg = ArgSpec.aligned([torch.float32] * 3, [256]), Config({"XBLOCK": 128}, 2)
    worker = WorkerProcess()
    try:
        deadline = time.monotonic() + 300
        while not worker.ready():
            assert worker.process.poll() is None and time.monotonic() < deadline, "worker did not start"
            time.sleep(0.05)
        fn = load_kernel(kernel.name, kernel.source, tf_config.cache_dir)
        request = compile_request(fn, cfg, argspec, sm90())
        assert worker.compile(kernel.name, kernel.source, tf_config.cache_dir, request, sm90()) is None
        cached = sorted(p.name for p in pathlib.Path(knobs.cache.dir).iterdir())
        assert cached, "the worker wrote nothing to Triton's cache"
        futures, _ = CompilePool(workers=0).submit(kernel, [cfg], argspec, sm90())
        assert futures[cfg].result().asm["cubin"]
        # the same cache key: the binary came from the worker's entry
        assert sorted(p.name for p in pathlib.Path(knobs.cache.dir).iterdir()) == cached
        bad = add_kernel("triton_poi_worker_bad_0")
        bad_request = compile_request(load_kernel(bad.name, bad.source, tf_config.cache_dir),
                                      Config({"XBLOCK": 3}, 1), argspec, sm90())
        error = worker.compile(bad.name, bad.source, tf_config.cache_dir, bad_request, sm90())
        assert isinstance(error, str) and error
    finally:
        worker.close()
        worker.process.wait(timeout=60)


def test_a_worker_compiles_without_importing_torch(tmp_path):
    """What a worker process runs (its imports, a kernel's load and compile) leaves torch
    unimported: a worker is ready in a fraction of a second, not after torch's ~2 s of
    CPU, which every worker spent at once while the compiling process still lowered."""
    code = f"""
import pickle, sys
sys.path.insert(0, {os.path.dirname(compile_workers_path())!r})
import compile_workers
compile_requested, load_kernel = compile_workers._compiler()
name, source, request, target = pickle.load(sys.stdin.buffer)
compiled = compile_requested(load_kernel(name, source, {str(tmp_path)!r}), request, target)
assert compiled.asm["cubin"]
print("torch imported:", "torch" in sys.modules)
"""
    from tritonfuse.runtime.async_compile import compile_request
    from tritonfuse.runtime.kernel_modules import load_kernel
    kernel = add_kernel("triton_poi_worker_no_torch_0")
    argspec, cfg = ArgSpec.aligned([torch.bfloat16] * 3, [256]), Config({"XBLOCK": 128}, 2)
    request = compile_request(load_kernel(kernel.name, kernel.source, str(tmp_path)), cfg, argspec, sm90())
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", TRITON_CACHE_DIR=str(tmp_path / "triton"))
    done = subprocess.run([sys.executable, "-c", code], input=pickle.dumps((kernel.name, kernel.source, request, sm90())),
                          capture_output=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert done.stdout.decode().strip() == "torch imported: False"


def compile_workers_path() -> str:
    from tritonfuse.runtime import compile_workers
    return compile_workers.__file__


class _StubWorker:
    """Stands in for a worker process: counts starts, never gets ready."""
    started = 0

    def __init__(self):
        type(self).started += 1

    def ready(self):
        return False

    def close(self):
        pass


def test_worker_processes_start_at_the_first_slow_compile(fresh_pool, monkeypatch):
    """Binaries that Triton's cache holds load in milliseconds: a warm start starts no
    worker process (each would import Triton on a core the compile needs); the first
    compile still running after SLOW_COMPILE_S starts one per worker thread."""
    from tritonfuse.runtime import compile_workers
    monkeypatch.setattr(compile_workers, "WorkerProcess", _StubWorker)
    monkeypatch.setattr(_StubWorker, "started", 0)
    monkeypatch.setattr(async_compile, "SLOW_COMPILE_S", 0.2)
    seconds = {}

    def fake_compile(fn, cfg, argspec, target):
        time.sleep(seconds[cfg.kwargs["XBLOCK"]])
        return cfg

    monkeypatch.setattr(async_compile, "compile_kernel", fake_compile)
    pool = CompilePool(workers=2, processes=True)
    argspec = ArgSpec.aligned([torch.float32] * 3, [4096])
    try:
        quick = [Config({"XBLOCK": x}, 4) for x in (64, 128, 256)]
        seconds.update({64: 0.0, 128: 0.0, 256: 0.0, 512: 0.3})
        futures, _ = pool.submit(add_kernel("triton_poi_quick_0"), quick, argspec, sm90())
        assert [futures[c].result(timeout=60) for c in quick] == quick
        assert _StubWorker.started == 0 and pool._worker_processes == []
        slow = Config({"XBLOCK": 512}, 4)
        futures, _ = pool.submit(add_kernel("triton_poi_quick_0"), [slow], argspec, sm90())
        assert futures[slow].result(timeout=60) == slow
        assert _StubWorker.started == 2 and len(pool._worker_processes) == 2
    finally:
        pool.close()


def test_a_known_tuning_result_is_the_only_config_compiled_ahead(fresh_pool, monkeypatch):
    """Where the autotune cache holds a result for the kernel, its sizes and the GPU, a
    launcher compiles only that config ahead (a warm start loads one binary per kernel);
    without one it compiles every candidate."""
    import autotune_cache
    submitted = []

    def fake_precompile(name, source, configs, argspec, device_index):
        submitted.append(list(configs))
        return {}, False

    monkeypatch.setattr(async_compile, "precompile", fake_precompile)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: "Test GPU 80GB")
    monkeypatch.setattr(tf_config, "autotune", "default")
    kernel = add_kernel("triton_poi_known_0")
    candidates = [Config({"XBLOCK": x}, 4) for x in (256, 512, 1024)]

    def launcher():
        return TritonLauncher(kernel.name, kernel.source, "pointwise", {"x": 1 << 20}, device_type="cuda",
                              configs=candidates, pointer_dtypes=[torch.float32] * 3, device_index=0)

    first = launcher()
    assert submitted.pop() == candidates
    key = autotune_cache.make_key(first._tuning_source(), [c.to_dict() for c in candidates], "Test GPU 80GB",
                                  autotune_cache.current_versions())
    autotune_cache.AutotuneCache().put(key, {"kernel_name": kernel.name, "config": candidates[1].to_dict(),
                                             "device": "Test GPU 80GB",
                                             "versions": autotune_cache.current_versions(),
                                             "timings_ms": {"x": 1.0}})
    launcher()
    assert submitted.pop() == [candidates[1]]


# --- the autotuning budget ------------------------------------------------------------

SIZES = [{"x": 1}, {"x": 100}, {"x": 5000}, {"x": 98304}, {"x": 3 << 20}, {"y": 7, "x": 300},
         {"y": 768, "x": 4096}, {"x": 8, "r": 50257}, {"x": 4096, "r": 768}, {"x": 100, "r": 3},
         {"x": 32768, "r": 128}, {"x": 1, "r": 1 << 20}]


@pytest.mark.parametrize("numels", SIZES, ids=str)
def test_pruning_keeps_the_config_autotune_none_runs(numels):
    if "r" in numels:
        kinds = ["reduction", "persistent_reduction"]
    else:
        kinds = ["pointwise_2d"] if "y" in numels else ["pointwise"]
    for kind in kinds:
        for hint in ((None, "inner", "outer") if "r" in numels else (None,)):
            none = candidate_configs(kind, numels, "none", hint=hint)
            default = candidate_configs(kind, numels, "default", hint=hint)
            full = candidate_configs(kind, numels, "max", hint=hint)
            assert len(none) == 1 and default[0] == none[0] == full[0]
            assert len(set(default)) == len(default) and set(default) <= set(full)
            for cfg in full:                      # powers of two, within the sizes
                assert all(v & (v - 1) == 0 for v in cfg.kwargs.values()), cfg
            elements = 1
            for v in numels.values():
                elements *= v
            if elements < TUNE_MIN_ELEMENTS:
                assert default == none            # nothing to tune: nothing else compiled


def test_identical_kernels_are_tuned_once(monkeypatch):
    """A kernel with another name but the same body and sizes reuses the first one's
    tuning result; other sizes are tuned again."""
    monkeypatch.setattr(tf_config, "autotune_under_interpreter", True)
    autotuner.forget_all()
    autotuner.stats.reset()
    configs = [Config({"XBLOCK": 16}, 1), Config({"XBLOCK": 64}, 2)]

    def run(name, n):
        kernel = add_kernel(name)
        launcher = TritonLauncher(kernel.name, kernel.source, "pointwise", {"x": n}, [2], "cpu", configs)
        a, b, out = torch.randn(n), torch.randn(n), torch.empty(n)
        launcher.run(a, b, out, n)
        torch.testing.assert_close(out, a + b)
        return launcher

    first = run("triton_poi_fused_add_0", 100)
    second = run("triton_poi_fused_add_3", 100)
    assert (autotuner.stats.tuned, autotuner.stats.cache_hits) == (1, 1)
    assert second.chosen_config == first.chosen_config
    run("triton_poi_fused_add_4", 200)
    assert autotuner.stats.tuned == 2
    autotuner.forget_all()


def test_default_mode_takes_a_full_search_result(monkeypatch):
    """scripts/warmup_autotune.py tunes with "max"; a later "default" run uses that result
    (even a config outside its own candidates) and tunes nothing."""
    monkeypatch.setattr(tf_config, "autotune_under_interpreter", True)
    autotuner.forget_all()
    autotuner.stats.reset()
    n = TUNE_MIN_ELEMENTS                         # the smallest size "default" tunes
    kernel = add_kernel("triton_poi_fused_add_0")
    a, b, out = torch.randn(n), torch.randn(n), torch.empty(n)
    timings = {}

    default = candidate_configs("pointwise", {"x": n}, "default")

    def fake_select_best(candidates, launch, *args, **kwargs):
        best = [c for c in candidates if c not in default][-1]   # what a full search found
        timings.update({str(c): 1.0 for c in candidates})
        launch(best)
        return best, timings

    monkeypatch.setattr(tf_config, "autotune", "max")
    monkeypatch.setattr(autotuner, "select_best", fake_select_best)
    tuned = TritonLauncher(kernel.name, kernel.source, "pointwise", {"x": n}, [2], "cpu")
    tuned.run(a, b, out, n)
    autotuner.forget_all()                        # a new process: only the cache on disk
    monkeypatch.setattr(tf_config, "autotune", "default")
    monkeypatch.setattr(autotuner, "select_best", None)   # must not tune
    deployed = TritonLauncher(kernel.name, kernel.source, "pointwise", {"x": n}, [2], "cpu", default)
    deployed.run(a, b, out, n)
    torch.testing.assert_close(out, a + b)
    assert deployed.chosen_config == tuned.chosen_config
    assert deployed.chosen_config not in deployed.candidates
    assert autotuner.stats.cache_hits == 1
    autotuner.forget_all()


COMPILE_BENCH = pathlib.Path(__file__).resolve().parents[1] / "scripts" / "compile_bench.py"


def test_compile_bench_counts_a_models_compilations():
    """scripts/compile_bench.py generates a model's CUDA kernels on the CPU: two identical
    transformer blocks need fewer unique kernels than launches, and fewer compilations."""
    proc = subprocess.run([sys.executable, str(COMPILE_BENCH), "--mode", "kernels", "--model", "block",
                           "--layers", "2", "--batch", "1", "--seq", "8", "--dtype", "float32", "--count-only"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    launches, definitions, unique = map(int, re.search(
        r"kernels: (\d+) launches in the graphs, (\d+) definitions .*?, (\d+) unique", proc.stdout).groups())
    before = int(re.search(r"compilations before: +(\d+)", proc.stdout).group(1))
    after = int(re.search(r"compilations after: +(\d+)", proc.stdout).group(1))
    assert unique <= definitions < launches and after < before


def test_compile_bench_first_calls_run_end_to_end(tmp_path):
    """The GPU mode of scripts/compile_bench.py, on the CPU (Triton's interpreter): a
    serial run, in its own process, reports its first call, which gives eager's loss."""
    out = tmp_path / "compile_bench.json"
    proc = subprocess.run([sys.executable, str(COMPILE_BENCH), "--mode", "first-call", "--device", "cpu",
                           "--models", "mlp", "--layers", "1", "--batch", "1", "--seq", "8", "--dtype", "float32",
                           "--runs", "serial", "--budget", "500", "--out", str(out)],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, TRITONFUSE_CPU_BACKEND="triton"))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    serial = report["runs"][0]
    assert (serial["model"], serial["pool"], serial["cache"]) == ("mlp", "serial", "cold"), serial
    assert serial["first_call_s"] > 0 and serial["loss_rel_diff"] < 1e-4, serial
    assert serial["pool_workers"] == 0 and serial["eager_graphs"] == 0 and len(report["runs"]) == 1
    assert "| mlp | " in report["table"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_while_pool_threads_hold_locks_leaves_the_child_working(fresh_pool):
    """A fork (a DataLoader worker, say) while compile threads hold the pool's locks: the
    child gets a pool of its own and can load and compile kernels."""
    from tritonfuse.runtime import kernel_modules
    held, release = threading.Event(), threading.Event()

    def hold_locks():
        with async_compile._parse_lock, kernel_modules._modules_lock, async_compile._pool_lock:
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold_locks)
    holder.start()
    held.wait(60)
    pid = os.fork()
    if pid == 0:                                 # the child: only this thread
        status = 1
        try:
            pool = CompilePool(workers=0)
            argspec = ArgSpec.aligned([torch.float32] * 3, [4096])
            cfg = Config({"XBLOCK": 1024}, 4)
            futures, _ = pool.submit(add_kernel("triton_poi_forked_add_0"), [cfg], argspec, sm90())
            status = 0 if futures[cfg].result(timeout=120).asm["cubin"] and async_compile.pool() else 2
        finally:
            os._exit(status)
    release.set()
    holder.join()
    deadline = time.monotonic() + 300
    while (finished := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    if finished[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung on a lock held at the fork")
    assert os.waitstatus_to_exitcode(finished[1]) == 0


def test_triton_is_hashed_once_in_the_background(monkeypatch):
    """A GPU compile starts hashing Triton (its cache key) in a daemon thread while
    aot_autograd traces: one thread per process, and the pool's compiles then find it done."""
    from triton.runtime import cache
    calls = []
    monkeypatch.setattr(cache, "triton_key", lambda: calls.append(threading.current_thread().name), raising=False)
    monkeypatch.setattr(async_compile, "_triton_hashed", False)
    monkeypatch.setattr(async_compile, "_hash_thread", None)
    async_compile.hash_triton_in_background()
    thread = async_compile._hash_thread
    async_compile.hash_triton_in_background()      # already started: no second thread
    assert async_compile._hash_thread is thread and thread.daemon
    thread.join(60)
    async_compile._hash_triton_once()              # what a pool thread calls: nothing left to do
    assert calls == ["tritonfuse-triton-key"] and async_compile._triton_hashed


def test_compile_seconds_by_phase(device, monkeypatch):
    """metrics.compile_seconds splits a compile into its phases (what a first call's
    seconds went to), and Triton launchers' first runs (binaries, tuning) are counted."""
    monkeypatch.setattr(tf_config, "graph_cache", False)
    check(lambda x: torch.softmax(x * 1.7, -1) + 1, torch.randn(8, 33, device=device))
    phases = metrics.compile_seconds
    assert {"lower", "schedule", "codegen", "load"} <= set(phases), phases
    assert all(seconds >= 0 for seconds in phases.values())
    uses_triton = device == "cuda" or tf_config.cpu_backend == "triton"
    assert ("first_run" in phases) == uses_triton, phases


FIRST_COMPILE_SCRIPT = """
import importlib.abc, sys, torch
from torch.fx.experimental import proxy_tensor
import tritonfuse
from tritonfuse import metrics

imported_in_trace = []
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.startswith(("tritonfuse", "cpu_backend")) and proxy_tensor.get_proxy_mode() is not None:
            imported_in_trace.append(name)
        return None
sys.meta_path.insert(0, Watch())

emb, lin = torch.nn.Embedding(50, 16), torch.nn.Linear(16, 50)
step = lambda ids: torch.nn.functional.cross_entropy(lin(emb(ids) * torch.tensor(0.5)).flatten(0, 1),
                                                      ids.flatten())
ids = torch.randint(0, 50, (2, 8))
torch.compile(step, backend="tritonfuse")(ids).backward()
print(metrics.eager_graphs, imported_in_trace)
"""


def test_a_first_compile_imports_nothing_of_tritonfuse_inside_the_trace(tmp_path):
    """The first compile of a process (a training step whose backward decomposes the
    embedding's gradient): tritonfuse's modules are imported before aot_autograd traces,
    not by a decomposition inside the trace, where a module that made a tensor at import
    put it in the user's graph and the graph ran eagerly (BERT, GPT-2, Llama, T5)."""
    env = dict(os.environ, TRITONFUSE_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", FIRST_COMPILE_SCRIPT], capture_output=True, text=True,
                         env=env, timeout=600, check=True).stdout.strip().splitlines()[-1]
    assert out == "0 []", out   # no eager graph, no module imported while a trace ran
