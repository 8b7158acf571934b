"""TritonLauncher on hand-written kernels: under the interpreter on CPU tensors (always) and
compiled on CUDA tensors (where a GPU is present)."""
import contextlib
import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from triton.runtime.jit import JITFunction

import autotune_cache
import tritonfuse.config as tf_config
from tritonfuse.runtime import autotuner
from tritonfuse.runtime.heuristics import Config
from tritonfuse.runtime.triton_launcher import TritonLauncher, load_kernel

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_CUDA = torch.cuda.is_available()
HEADER = "import triton\nimport triton.language as tl\n\n\n"

POINTWISE = HEADER + textwrap.dedent("""
    @triton.jit
    def triton_poi_fused_add_sin_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK: tl.constexpr):
        xoffset = tl.program_id(0) * XBLOCK
        xindex = xoffset + tl.arange(0, XBLOCK)
        xmask = xindex < xnumel
        tmp0 = tl.load(in_ptr0 + xindex, xmask)
        tmp1 = tl.load(in_ptr1 + xindex, xmask)
        tmp2 = tl.sin(tmp0) + tmp1
        tl.store(out_ptr0 + xindex, tmp2, xmask)
""")

# Looped reduction: rows of rnumel contiguous elements, sum of sigmoid.
REDUCTION = HEADER + textwrap.dedent("""
    @triton.jit
    def triton_red_fused_sigmoid_sum_0(in_ptr0, out_ptr0, xnumel, rnumel,
                                       XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
        xmask = xindex < xnumel
        rbase = tl.arange(0, RBLOCK)[None, :]
        acc = tl.zeros([XBLOCK, RBLOCK], tl.float32)
        for roffset in range(0, rnumel, RBLOCK):
            rindex = roffset + rbase
            rmask = rindex < rnumel
            tmp0 = tl.load(in_ptr0 + (rindex + rnumel * xindex), xmask & rmask, other=0.0)
            acc = acc + tl.where(xmask & rmask, tl.sigmoid(tmp0), 0.0)
        tmp1 = tl.sum(acc, 1)[:, None]
        tl.store(out_ptr0 + xindex, tmp1, xmask)
""")

# Persistent reduction: softmax over rows (tl.max / tl.sum are @jit library functions).
SOFTMAX = HEADER + textwrap.dedent("""
    @triton.jit
    def triton_per_fused_softmax_0(in_ptr0, out_ptr0, xnumel, rnumel,
                                   XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
        xmask = xindex < xnumel
        rindex = tl.arange(0, RBLOCK)[None, :]
        rmask = rindex < rnumel
        tmp0 = tl.load(in_ptr0 + (rindex + rnumel * xindex), xmask & rmask, other=0.0)
        tmp1 = tl.max(tl.where(rmask, tmp0, float("-inf")), 1)[:, None]
        tmp2 = tl.exp(tmp0 - tmp1)
        tmp3 = tl.where(xmask & rmask, tmp2, 0.0)
        tmp4 = tl.sum(tmp3, 1)[:, None]
        tl.store(out_ptr0 + (rindex + rnumel * xindex), tmp2 / tmp4, xmask & rmask)
""")

# Tiled transpose: out (Y, X) = in (X, Y).T; x on grid axis 0, y on axis 1.
TRANSPOSE = HEADER + textwrap.dedent("""
    @triton.jit
    def triton_poi_fused_clone_0(in_ptr0, out_ptr0, ynumel, xnumel,
                                 YBLOCK: tl.constexpr, XBLOCK: tl.constexpr):
        yindex = tl.program_id(1) * YBLOCK + tl.arange(0, YBLOCK)[None, :]
        ymask = yindex < ynumel
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
        xmask = xindex < xnumel
        tmp0 = tl.load(in_ptr0 + (yindex + ynumel * xindex), xmask & ymask)
        tl.store(out_ptr0 + (xindex + xnumel * yindex), tmp0, xmask & ymask)
""")

# Accumulates into its output: atomically, and by a plain load + store.
ATOMIC_ADD = HEADER + textwrap.dedent("""
    @triton.jit
    def triton_poi_atomic_acc_0(in_ptr0, out_ptr0, xnumel, XBLOCK: tl.constexpr):
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        xmask = xindex < xnumel
        tmp0 = tl.load(in_ptr0 + xindex, xmask)
        tl.atomic_add(out_ptr0 + xindex, tmp0, xmask)
""")
LOAD_STORE_ADD = HEADER + textwrap.dedent("""
    @triton.jit
    def triton_poi_inplace_add_0(in_out_ptr0, in_ptr0, xnumel, XBLOCK: tl.constexpr):
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
        xmask = xindex < xnumel
        tmp0 = tl.load(in_out_ptr0 + xindex, xmask)
        tmp1 = tl.load(in_ptr0 + xindex, xmask)
        tl.store(in_out_ptr0 + xindex, tmp0 + tmp1 * 2.0, xmask)
""")

DEVICES = ["cpu"] + (["cuda"] if HAS_CUDA else [])


@pytest.fixture(autouse=True)
def isolated(tmp_path, monkeypatch):
    """Every test gets its own kernel and autotune caches and default knobs."""
    monkeypatch.setattr(tf_config, "cache_dir", str(tmp_path / "cache"))
    monkeypatch.setattr(tf_config, "autotune", "default")
    monkeypatch.setattr(tf_config, "autotune_under_interpreter", False)
    monkeypatch.setattr(tf_config, "autotune_cache_dir", str(tmp_path / "autotune"))
    autotuner.stats.reset()
    autotuner.forget_all()
    yield
    autotuner.stats.reset()
    autotuner.forget_all()


def launcher_for(source, kind, numels, mutated, device, **kw):
    name = source.split("def ")[1].split("(")[0]
    return TritonLauncher(name=name, source=source, kind=kind, numels=numels,
                          mutated_arg_indices=mutated, device_type=device, **kw)


@pytest.mark.parametrize("device", DEVICES)
def test_pointwise(device):
    n = 300
    launcher = launcher_for(POINTWISE, "pointwise", {"x": n}, [2], device)
    for _ in range(2):                       # the second call takes the bound launch
        a, b = torch.randn(n, device=device), torch.randn(n, device=device)
        out = torch.empty(n, device=device)
        launcher.run(a, b, out, n)
        torch.testing.assert_close(out, torch.sin(a) + b)
    assert launcher.chosen_config in launcher.candidates
    if device == "cpu":                      # no tuning under the interpreter by default
        assert launcher.chosen_config == launcher.candidates[0]
        assert autotuner.stats.tuned == 0


@pytest.mark.parametrize("device", DEVICES)
def test_looped_reduction(device):
    x, r = 5, 37
    launcher = launcher_for(REDUCTION, "reduction", {"x": x, "r": r}, [1], device,
                            configs=[Config({"XBLOCK": 2, "RBLOCK": 16}, num_warps=2)])
    inp, out = torch.randn(x, r, device=device), torch.empty(x, device=device)
    launcher.run(inp, out, x, r)
    torch.testing.assert_close(out, torch.sigmoid(inp).sum(1))
    assert launcher.chosen_config.kwargs == {"XBLOCK": 2, "RBLOCK": 16}


@pytest.mark.parametrize("device", DEVICES)
def test_persistent_reduction_softmax(device):
    x, r = 6, 20
    launcher = launcher_for(SOFTMAX, "persistent_reduction", {"x": x, "r": r}, [1], device)
    inp, out = torch.randn(x, r, device=device), torch.empty(x, r, device=device)
    launcher.run(inp, out, x, r)
    torch.testing.assert_close(out, torch.softmax(inp, 1))
    assert launcher.chosen_config.kwargs["RBLOCK"] == 32


@pytest.mark.parametrize("device", DEVICES)
def test_tiled_transpose(device):
    y, x = 9, 70
    launcher = launcher_for(TRANSPOSE, "pointwise_2d", {"y": y, "x": x}, [1], device,
                            configs=[Config({"YBLOCK": 4, "XBLOCK": 32}, num_warps=2)])
    inp, out = torch.randn(x, y, device=device), torch.empty(y, x, device=device)
    launcher.run(inp, out, y, x)
    torch.testing.assert_close(out, inp.t())
    assert launcher.grid(launcher.chosen_config) == (3, 3, 1)


def test_grid_puts_x_on_axis_0_and_checks_the_y_limit():
    launcher = launcher_for(TRANSPOSE, "pointwise_2d", {"y": 70000, "x": 1 << 20}, [1], "cpu")
    assert launcher.grid(Config({"YBLOCK": 2, "XBLOCK": 64}, 2)) == (16384, 35000, 1)
    with pytest.raises(ValueError, match="grid axis 1"):
        launcher.grid(Config({"YBLOCK": 1, "XBLOCK": 64}, 2))
    for cfg in launcher.candidates:          # the heuristics never exceed the limit
        launcher.grid(cfg)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("source,kind", [(ATOMIC_ADD, "atomic"), (LOAD_STORE_ADD, "load_store")])
def test_accumulating_kernel_is_correct_after_tuning(device, source, kind):
    tf_config.autotune_under_interpreter = True
    n = 100
    configs = [Config({"XBLOCK": 16}, 1), Config({"XBLOCK": 32}, 1), Config({"XBLOCK": 128}, 4)]
    inp = torch.randn(n, device=device)
    acc = torch.randn(n, device=device)
    expected = acc + inp if kind == "atomic" else acc + 2 * inp
    if kind == "atomic":
        launcher = launcher_for(source, "pointwise", {"x": n}, [1], device, configs=configs)
        launcher.run(inp, acc, n)
    else:
        launcher = launcher_for(source, "pointwise", {"x": n}, [0], device, configs=configs)
        launcher.run(acc, inp, n)
    assert autotuner.stats.tuned == 1 and len(launcher.timings_ms) == 3
    torch.testing.assert_close(acc, expected)


def test_failing_candidate_is_skipped(caplog):
    tf_config.autotune_under_interpreter = True
    n = 40
    configs = [Config({"XBLOCK": 3}, 1), Config({"XBLOCK": 16}, 1)]   # arange needs 2**k
    launcher = launcher_for(POINTWISE, "pointwise", {"x": n}, [2], "cpu", configs=configs)
    a, b, out = torch.randn(n), torch.randn(n), torch.empty(n)
    with caplog.at_level(logging.INFO, logger="tritonfuse.autotune"):
        launcher.run(a, b, out, n)
    torch.testing.assert_close(out, torch.sin(a) + b)
    assert launcher.chosen_config == configs[1]
    assert sum("skipping XBLOCK=3" in r.getMessage() for r in caplog.records) == 1


TWO_CONFIGS = [Config({"XBLOCK": 16}, 1), Config({"XBLOCK": 64}, 2)]


def test_tuned_config_is_cached_and_version_change_misses(monkeypatch):
    tf_config.autotune_under_interpreter = True
    n = 64
    args = lambda: (torch.randn(n), torch.randn(n), torch.empty(n), n)  # noqa: E731
    first = launcher_for(POINTWISE, "pointwise", {"x": n}, [2], "cpu", configs=TWO_CONFIGS)
    first.run(*args())
    assert (autotuner.stats.tuned, autotuner.stats.cache_hits) == (1, 0)
    entries = list(autotune_cache.AutotuneCache().entries())
    assert len(entries) == 1
    assert entries[0]["kernel_name"] == "triton_poi_fused_add_sin_0"
    assert entries[0]["config"] == first.chosen_config.to_dict()
    assert set(entries[0]["timings_ms"]) == {str(c) for c in first.candidates}

    autotuner.forget_all()                   # as in a new process: from the cache on disk
    second = launcher_for(POINTWISE, "pointwise", {"x": n}, [2], "cpu", configs=TWO_CONFIGS)
    second.run(*args())
    assert (autotuner.stats.tuned, autotuner.stats.cache_hits) == (1, 1)
    assert second.chosen_config == first.chosen_config

    real = autotune_cache.current_versions()
    monkeypatch.setattr(autotune_cache, "current_versions", lambda: dict(real, triton="99.0"))
    third = launcher_for(POINTWISE, "pointwise", {"x": n}, [2], "cpu", configs=TWO_CONFIGS)
    third.run(*args())
    assert (autotuner.stats.tuned, autotuner.stats.cache_hits) == (2, 1)


def test_autotune_none_and_single_candidate_skip_tuning():
    tf_config.autotune_under_interpreter = True
    tf_config.autotune = "none"
    n = 32
    launcher = launcher_for(POINTWISE, "pointwise", {"x": n}, [2], "cpu")
    assert len(launcher.candidates) == 1
    a, b, out = torch.randn(n), torch.randn(n), torch.empty(n)
    launcher.run(a, b, out, n)
    torch.testing.assert_close(out, torch.sin(a) + b)
    assert autotuner.stats.tuned == 0 and autotune_cache.AutotuneCache().keys() == []


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET", "0") != "0",
                    reason="TRITON_INTERPRET is set for the whole process")
def test_interpreter_is_scoped_to_the_call(tmp_path):
    original_call = JITFunction.__call__
    launcher = launcher_for(SOFTMAX, "persistent_reduction", {"x": 2, "r": 8}, [1], "cpu")
    inp, out = torch.randn(2, 8), torch.empty(2, 8)
    launcher.run(inp, out, 2, 8)
    torch.testing.assert_close(out, torch.softmax(inp, 1))
    assert JITFunction.__call__ is original_call
    # The kernel module itself holds a compiled-mode JITFunction, usable on a GPU.
    fn = load_kernel("triton_per_fused_softmax_0", SOFTMAX, str(tmp_path / "cache"))
    assert isinstance(fn, JITFunction)
    assert os.path.basename(fn.fn.__code__.co_filename) == "triton_per_fused_softmax_0.py"
    assert os.path.exists(fn.fn.__code__.co_filename)


# A NaN-propagating row max: tl.reduce with a custom combine (tf_helpers.max2), which the
# interpreter calls once per element pair.
NAN_MAX = HEADER + textwrap.dedent("""
    from tritonfuse.runtime import triton_helpers as tf_helpers

    @triton.jit
    def triton_per_fused_amax_0(in_ptr0, out_ptr0, xnumel, rnumel,
                                XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
        xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)[:, None]
        xmask = xindex < xnumel
        rindex = tl.arange(0, RBLOCK)[None, :]
        rmask = rindex < rnumel
        tmp0 = tl.load(in_ptr0 + (rindex + rnumel * xindex), xmask & rmask, other=float("-inf"))
        tmp1 = tf_helpers.max2(tl.where(rmask, tmp0, float("-inf")), 1)[:, None]
        tl.store(out_ptr0 + xindex, tmp1, xmask)
""")


def test_interpreted_combine_calls_do_not_repatch_the_language(monkeypatch):
    """The language is patched once per interpreted launch, not once per call of a
    reduction's combine function (which made NaN-propagating max 3-5x slower)."""
    from tritonfuse.runtime import triton_launcher
    patches = []
    real_patch_lang = None

    def counting(fn):
        patches.append(fn.__name__)
        return real_patch_lang(fn)

    original_enter = triton_launcher._jit_calls_interpreted

    @contextlib.contextmanager
    def counted_calls():
        nonlocal real_patch_lang
        with original_enter():
            real_patch_lang = triton_launcher._InterpState.patch_lang
            triton_launcher._InterpState.patch_lang = counting
            try:
                yield
            finally:
                triton_launcher._InterpState.patch_lang = real_patch_lang

    monkeypatch.setattr(triton_launcher, "_jit_calls_interpreted", counted_calls)
    counts = []
    for r in (24, 96):                      # 4 rows of r elements: 4 * (r - 1) combine calls
        x = 4
        launcher = launcher_for(NAN_MAX, "persistent_reduction", {"x": x, "r": r}, [1], "cpu",
                                configs=[Config({"XBLOCK": 4, "RBLOCK": 128}, num_warps=1)])
        inp = torch.randn(x, r)
        inp[1, 5] = float("nan")
        out = torch.empty(x)
        patches.clear()
        launcher.run(inp, out, x, r)
        torch.testing.assert_close(out, inp.amax(1), equal_nan=True)
        assert out[1].isnan() and not out[[0, 2, 3]].isnan().any()
        assert patches[0] == "triton_per_fused_amax_0"
        counts.append(len(patches))
    # a patch per launch and per @jit call of another module, none per element pair
    assert counts[0] == counts[1] <= 4, (counts, patches)


HIT_SCRIPT = textwrap.dedent("""
    import json, sys, torch
    import tritonfuse.config as cfg
    from tritonfuse.runtime import autotuner
    from tritonfuse.runtime.heuristics import Config
    from tritonfuse.runtime.triton_launcher import TritonLauncher
    cfg.autotune_under_interpreter = True
    configs = [Config({"XBLOCK": 16}, 1), Config({"XBLOCK": 64}, 2)]
    launcher = TritonLauncher("triton_poi_fused_add_sin_0", sys.argv[1], "pointwise", {"x": 64},
                              [2], "cpu", configs)
    a, b, out = torch.randn(64), torch.randn(64), torch.empty(64)
    launcher.run(a, b, out, 64)
    assert torch.allclose(out, torch.sin(a) + b, atol=1e-5, rtol=1e-5)  # tl.sin is approximate on GPUs
    print(json.dumps({"tuned": autotuner.stats.tuned, "hits": autotuner.stats.cache_hits,
                      "config": str(launcher.chosen_config)}))
""")


def test_cache_hit_in_a_second_process(tmp_path):
    script = tmp_path / "hit.py"
    script.write_text(HIT_SCRIPT)
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TRITONFUSE_AUTOTUNE_CACHE_DIR=str(tmp_path / "autotune"),
               TRITONFUSE_CACHE_DIR=str(tmp_path / "cache"), TRITONFUSE_AUTOTUNE="default")
    env.pop("TRITON_INTERPRET", None)
    results = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, str(script), POINTWISE], env=env, cwd=str(tmp_path),
                              capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert (results[0]["tuned"], results[0]["hits"]) == (1, 0)
    assert (results[1]["tuned"], results[1]["hits"]) == (0, 1)
    assert results[0]["config"] == results[1]["config"]


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_cuda_fast_launch_handles_new_and_misaligned_tensors(monkeypatch):
    n = 1000
    monkeypatch.setattr(tf_config, "autotune", "max")   # "default" gives a kernel this small one config
    launcher = launcher_for(POINTWISE, "pointwise", {"x": n}, [2], "cuda")
    a, b, out = (torch.randn(n, device="cuda") for _ in range(3))
    launcher.run(a, b, out, n)
    torch.testing.assert_close(out, torch.sin(a) + b)
    assert autotuner.stats.tuned == 1
    assert launcher.run.__name__ == "fast_launch"

    def no_jit(*args, **kwargs):
        raise AssertionError("took the JIT dispatch path")

    with monkeypatch.context() as m:         # later calls bypass JITFunction.run
        m.setattr(launcher._fn, "run", no_jit)
        for _ in range(3):                   # new tensors, same shapes
            a, b = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
            out = torch.empty(n, device="cuda")
            launcher.run(a, b, out, n)
            torch.testing.assert_close(out, torch.sin(a) + b)
        a_off = torch.randn(n + 1, device="cuda")[1:]   # 4-byte aligned only
        with pytest.raises(AssertionError, match="JIT dispatch"):
            launcher.run(a_off, b, out, n)
        with pytest.raises(AssertionError, match="JIT dispatch"):
            launcher.run(a.half(), b.half(), out.half(), n)
    out = torch.empty(n, device="cuda")
    launcher.run(a_off, b, out, n)           # the general path re-specializes: still right
    torch.testing.assert_close(out, torch.sin(a_off) + b)
    # A CPU (interpreted) kernel in the same process leaves the CUDA path compiled.
    cpu = launcher_for(POINTWISE, "pointwise", {"x": 8}, [2], "cpu")
    ac, bc, oc = torch.randn(8), torch.randn(8), torch.empty(8)
    cpu.run(ac, bc, oc, 8)
    torch.testing.assert_close(oc, torch.sin(ac) + bc)
    launcher.run(a, b, out, n)
    torch.testing.assert_close(out, torch.sin(a) + b)
