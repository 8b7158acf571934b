"""The C++ build-and-load layer (cpu_backend/build.py): build cache across processes,
concurrent builds, compiler discovery errors, compile errors, the ctypes callable."""
import concurrent.futures
import ctypes
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

import tritonfuse.config
import tritonfuse.metrics
from cpu_backend import build

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ADD_SOURCE = textwrap.dedent(
    r"""
    #include "tritonfuse_vec.h"
    // out = a + b, vectorized with a partial tail, parallel over chunks.
    extern "C" void kernel_add(const float* a, const float* b, float* out, const int64_t* n_ptr) {
        const int64_t n = *n_ptr;
    #pragma omp parallel for
        for (int64_t i = 0; i < n; i += tf::kVecLanes) {
            const int count = n - i < tf::kVecLanes ? int(n - i) : tf::kVecLanes;
            auto x = tf::Vec<float>::load_partial(a + i, count);
            auto y = tf::Vec<float>::load_partial(b + i, count);
            (x + y).store_partial(out + i, count);
        }
    }
    extern "C" void kernel_six(void* a, void* b, void* c, void* d, void* e, void* f) {}
    """
)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private build cache; config.cache_dir is read at call time."""
    monkeypatch.setattr(tritonfuse.config, "cache_dir", str(tmp_path))
    monkeypatch.setenv("TRITONFUSE_CACHE_DIR", str(tmp_path))
    return tmp_path


def _unique(source: str, tag: str) -> str:
    """Make a source distinct per test (the in-process memo is global)."""
    return f"// {tag} pid={os.getpid()}\n" + source


# Child processes only need tritonfuse.config/metrics and cpu_backend.build: register bare
# `tritonfuse` and `cpu_backend` packages so that their __init__s (torch, triton, dynamo,
# backend registration: seconds of import time per child) do not run.
CHILD_PRELUDE = textwrap.dedent(
    f"""
    import sys, types
    for _name in ("tritonfuse", "cpu_backend"):
        _pkg = types.ModuleType(_name)
        _pkg.__path__ = [{REPO!r} + "/" + _name]
        sys.modules[_name] = _pkg
    """
)


def _subprocess_env(cache_dir):
    env = dict(os.environ)
    env["TRITONFUSE_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_a_library_of_another_build_is_refused_and_rebuilt(cache_dir):
    """A sound library (it matches its size/hash record) copied with its record into
    another build's folder, with the same kernel name: refused before it is loaded (it
    would compute a + b where a - b is asked), deleted and built again."""
    first = build.build_kernel_library(_unique(ADD_SOURCE, "other-build-a"))
    source = _unique(ADD_SOURCE.replace("(x + y)", "(x - y)"), "other-build-b")
    second = build.build_kernel_library(source)
    for suffix in ("", ".sum"):   # a new file (writing into the loaded one would crash us)
        shutil.copy(first.so_path + suffix, second.so_path + suffix + ".new")
        os.replace(second.so_path + suffix + ".new", second.so_path + suffix)
    del build._loaded[second.key]             # as a new process sees the folder
    repairs = tritonfuse.metrics.cache_repairs
    again = build.build_kernel_library(source)
    assert again.compiled and tritonfuse.metrics.cache_repairs == repairs + 1
    kernel = build.KernelCallable(again.lib, "kernel_add", num_args=4)
    a, b, out = torch.randn(37), torch.randn(37), torch.empty(37)
    kernel.call_tensors(a, b, out, torch.tensor([37], dtype=torch.int64))
    torch.testing.assert_close(out, a - b)


def test_build_call_and_memo(cache_dir):
    source = _unique(ADD_SOURCE, "memo")
    builds = tritonfuse.metrics.cpp_builds
    res = build.build_kernel_library(source)
    assert res.compiled and res.origin == "compiled"
    assert tritonfuse.metrics.cpp_builds == builds + 1
    assert os.path.exists(res.so_path) and os.path.exists(res.cpp_path)
    assert res.so_path.startswith(os.path.join(str(cache_dir), "cpp", res.key[:2], res.key))
    with open(res.cpp_path) as f:   # kept for debugging, with the build's key marker
        assert f.read() == build._with_key_marker(source, res.key)

    kernel = build.KernelCallable(res.lib, "kernel_add", num_args=4)
    a, b = torch.randn(1000 + 3), torch.randn(1000 + 3)
    out = torch.empty_like(a)
    n = torch.tensor([a.numel()], dtype=torch.int64)
    kernel(a.data_ptr(), b.data_ptr(), out.data_ptr(), n.data_ptr())
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)
    kernel.call_tensors(b, a, out, n)
    torch.testing.assert_close(out, a + b, rtol=0, atol=0)

    again = build.build_kernel_library(source)
    assert again.origin == "memory" and again.lib is res.lib
    assert build.load_kernel_library(source) is res.lib
    assert tritonfuse.metrics.cpp_builds == builds + 1


def test_kernel_callable_six_pointer_args(cache_dir):
    lib = build.load_kernel_library(_unique(ADD_SOURCE, "six"))
    kernel = build.KernelCallable(lib, "kernel_six", num_args=6)
    assert isinstance(kernel, build.KernelCallable)
    assert kernel.argtypes == [ctypes.c_void_p] * 6 and kernel.restype is None
    ts = [torch.empty(4) for _ in range(6)]
    assert kernel(*[t.data_ptr() for t in ts]) is None
    with pytest.raises(TypeError):
        kernel(1, 2)
    assert "kernel_six" in repr(kernel)


def test_cache_hit_in_second_process(cache_dir):
    source = _unique(ADD_SOURCE, "second-process")
    assert build.build_kernel_library(source).compiled
    src_file = cache_dir / "source.cpp"
    src_file.write_text(source)
    script = CHILD_PRELUDE + textwrap.dedent(
        f"""
        import tritonfuse.metrics as m
        from cpu_backend import build
        res = build.build_kernel_library(open({str(src_file)!r}).read())
        print(res.origin, m.cpp_builds, m.cpp_build_cache_hits)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], env=_subprocess_env(cache_dir), capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["disk-cache", "0", "1"]


def test_concurrent_builds_of_same_source(cache_dir):
    source = _unique(ADD_SOURCE, "concurrent")
    src_file = cache_dir / "source.cpp"
    src_file.write_text(source)
    go_file = cache_dir / "go"
    # Both children wait for the same start signal, then build + run the same kernel.
    script = CHILD_PRELUDE + textwrap.dedent(
        f"""
        import ctypes, os, time
        import tritonfuse.metrics as m
        from cpu_backend import build
        while not os.path.exists({str(go_file)!r}):
            time.sleep(0.002)
        res = build.build_kernel_library(open({str(src_file)!r}).read())
        k = build.KernelCallable(res.lib, "kernel_add", num_args=4)
        a = (ctypes.c_float * 37)(*range(37)); out = (ctypes.c_float * 37)()
        n = ctypes.c_int64(37)
        k(ctypes.addressof(a), ctypes.addressof(a), ctypes.addressof(out), ctypes.addressof(n))
        assert list(out) == [2.0 * i for i in range(37)]
        print(m.cpp_builds, m.cpp_build_cache_hits)
        """
    )
    env = _subprocess_env(cache_dir)
    procs = [
        subprocess.Popen([sys.executable, "-c", script], env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    go_file.write_text("go")
    results = [p.communicate(timeout=240) for p in procs]
    for p, (stdout, stderr) in zip(procs, results):
        assert p.returncode == 0, stderr
    counts = [tuple(map(int, stdout.split())) for stdout, _ in results]
    assert sorted(counts) == [(0, 1), (1, 0)]  # exactly one compiled, the other waited and loaded
    folder = os.path.dirname(build.build_kernel_library(source).so_path)
    assert not [f for f in os.listdir(folder) if f.startswith(".tmp_")]  # no leftovers


def test_missing_compiler_from_cxx(monkeypatch):
    # $CXX naming no executable: a warning at import, and the default compiler is used
    values, problems = tritonfuse.config.from_environment({"CXX": "/nonexistent/g++"})
    assert values["cxx"] is None and len(problems) == 1 and "CXX='/nonexistent/g++'" in problems[0]
    with pytest.raises(ValueError, match="tritonfuse.config.cxx"):
        tritonfuse.config.cxx = "/nonexistent/g++"
    # a compiler that vanished after tritonfuse read $CXX
    monkeypatch.setitem(tritonfuse.config.__dict__, "cxx", "/nonexistent/g++")
    with pytest.raises(build.CompilerNotFoundError, match="/nonexistent/g\\+\\+"):
        build.find_compiler()
    with pytest.raises(build.CompilerNotFoundError):
        build.load_kernel_library("// never compiled\n")


def test_missing_compiler_on_path(monkeypatch, tmp_path):
    monkeypatch.setattr(tritonfuse.config, "cxx", None)
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no g++, no clang++
    with pytest.raises(build.CompilerNotFoundError) as info:
        build.find_compiler()
    message = str(info.value)
    assert "g++" in message and "clang++" in message and "apt-get install g++" in message
    assert issubclass(build.CompilerNotFoundError, RuntimeError)


def test_broken_openmp_is_reported(cache_dir, monkeypatch, tmp_path):
    # A compiler that works, except that it cannot link OpenMP programs.
    fake = tmp_path / "g++-without-openmp"
    fake.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do if [ "$a" = -fopenmp ]; then echo "ld: cannot find -lgomp" >&2; exit 1; fi; done\n'
        f'exec {build.find_compiler()} "$@"\n'
    )
    fake.chmod(0o755)
    monkeypatch.setattr(tritonfuse.config, "cxx", str(fake))
    with pytest.raises(build.CompilerNotFoundError) as info:
        build.compile_flags()
    assert "libgomp" in str(info.value) and "libomp" in str(info.value) and "cannot find -lgomp" in str(info.value)


def test_compile_error_reports_stderr_and_path(cache_dir):
    source = _unique('extern "C" void broken() { this_name_is_undeclared_42(); }\n', "broken")
    builds = tritonfuse.metrics.cpp_builds
    with pytest.raises(build.CppCompileError) as info:
        build.load_kernel_library(source)
    err = info.value
    assert "this_name_is_undeclared_42" in str(err) and "error" in str(err)
    assert err.cpp_path in str(err) and os.path.exists(err.cpp_path)
    assert "this_name_is_undeclared_42" in err.stderr
    assert not os.path.exists(os.path.join(os.path.dirname(err.cpp_path), "kernel.so"))
    assert tritonfuse.metrics.cpp_builds == builds


def test_flags(monkeypatch):
    flags = build.compile_flags()
    for required in ("-O3", "-std=c++17", "-shared", "-fPIC", "-fopenmp", "-fno-finite-math-only", "-fno-strict-aliasing"):
        assert required in flags
    for forbidden in ("-ffast-math", "-funsafe-math-optimizations", "-ffinite-math-only", "-fassociative-math"):
        assert forbidden not in flags
    assert build.INCLUDE_DIR in flags
    monkeypatch.setattr(tritonfuse.config, "cxxflags", "-DTF_TEST_FLAG=1 -g0")
    assert build.compile_flags()[-2:] == ["-DTF_TEST_FLAG=1", "-g0"]


def test_flags_the_compiler_rejects_are_left_out(cache_dir, monkeypatch):
    monkeypatch.setattr(tritonfuse.config, "cxxflags", "-DTF_FINE=1 -fno-such-flag-tritonfuse")
    with pytest.warns(tritonfuse.config.SettingWarning, match="TRITONFUSE_CXXFLAGS=.*rejected"):
        flags = build.compile_flags()
    assert "-DTF_FINE=1" not in flags and "-fno-such-flag-tritonfuse" not in flags
    assert build.build_kernel_library(_unique(ADD_SOURCE, "rejected-flags")).lib is not None


def test_extra_flags_change_the_cache_key(cache_dir, monkeypatch):
    source = _unique(ADD_SOURCE, "flags")
    first = build.build_kernel_library(source)
    monkeypatch.setattr(tritonfuse.config, "cxxflags", ("-DTF_SOMETHING_ELSE=1",))
    second = build.build_kernel_library(source)
    assert second.key != first.key and second.compiled
    third = build.build_kernel_library(source, extra_flags=["-DTF_THIRD=1"])
    assert third.key not in (first.key, second.key) and third.compiled


def test_threads_building_the_same_source(cache_dir):
    source = _unique(ADD_SOURCE, "threads")
    builds = tritonfuse.metrics.cpp_builds
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: build.build_kernel_library(source), range(4)))
    assert sorted(r.origin for r in results) == ["compiled", "memory", "memory", "memory"]
    assert len({id(r.lib) for r in results}) == 1
    assert tritonfuse.metrics.cpp_builds == builds + 1


def test_default_num_threads():
    assert build.default_num_threads() == torch.get_num_threads()
