"""Large C++ kernel libraries compile as several translation units at once, linked into
the one library (cpu_backend/build.py: _plan_parts, _compile_parts). The size a part
needs is lowered here, so that small sources split."""
import ctypes
import os

import pytest
import torch

import tritonfuse
import tritonfuse.config
import tritonfuse.metrics
from cpu_backend import build

# Every unit repeats the prelude: its helper has internal linkage, its header only inline
# functions and templates.
PRELUDE = '// test library\n#include "tf_kernel.h"\nstatic float tf_test_offset(int i) { return 0.5f * i; }\n'


def _kernel(i: int, body: str = "") -> tuple[str, str]:
    name = f"tf_test_kernel_{i}"
    return name, (f'extern "C" void {name}(const float* __restrict__ a, float* __restrict__ out, int64_t n) {{\n'
                  f"    {body}\n"
                  f"    for (int64_t j = 0; j < n; ++j) out[j] = a[j] * {i + 1}.0f + tf_test_offset({i});\n"
                  "}\n")


def _library(tag: str, count: int, broken: int | None = None) -> tuple[str, list[str]]:
    kernels = [_kernel(i, "this_name_is_undeclared_7(a);" if i == broken else "") for i in range(count)]
    source = build.kernel_library_source(f"// {tag} pid={os.getpid()}\n" + PRELUDE, kernels)
    return source, [name for name, _ in kernels]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private build cache; config.cache_dir is read at call time."""
    monkeypatch.setattr(tritonfuse.config, "cache_dir", str(tmp_path))
    monkeypatch.setenv("TRITONFUSE_CACHE_DIR", str(tmp_path))
    return tmp_path


@pytest.fixture
def split(monkeypatch):
    """Any source with two kernels or more splits, into up to three parts; returns the
    plans made (None: one translation unit)."""
    monkeypatch.setattr(build, "_PART_MIN_BYTES", 1)
    monkeypatch.setattr(build, "_parallel_jobs", lambda: 3)
    plans, plan = [], build._plan_parts

    def recording(source, jobs):
        plans.append(plan(source, jobs))
        return plans[-1]

    monkeypatch.setattr(build, "_plan_parts", recording)
    return plans


def _temp_files(root) -> list[str]:
    return [os.path.join(folder, name) for folder, _, names in os.walk(root) for name in names
            if name.startswith(".tmp") or name.endswith((".o", ".tmp"))]


def test_parts_hold_each_kernel_once_balanced_by_size():
    kernels = [(f"k{i}", "x" * size) for i, size in enumerate([900, 100, 500, 400, 300, 200, 100])]
    source = build.kernel_library_source("#include <x>\n", kernels)
    prelude, kernels_found = build._split_kernels(source)
    assert prelude.rstrip() == "#include <x>" and [k.name for k in kernels_found] == [name for name, _ in kernels]
    for kernel in kernels_found:     # each starts at its marker, on the line it stands on
        assert source.splitlines()[kernel.line - 1] == build.KERNEL_MARKER + kernel.name
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(build, "_PART_MIN_BYTES", 100)
        prelude, parts = build._plan_parts(source, jobs=3)
        names = [[k.name for k in part] for part in parts]
        assert sorted(sum(names, [])) == sorted(name for name, _ in kernels)   # each exactly once
        assert all(part == sorted(part, key=lambda n: int(n[1:])) for part in names)   # in source order
        sizes = [sum(len(k.text) for k in part) for part in parts]
        assert len(parts) == 3 and max(sizes) - min(sizes) <= 200, sizes
        assert len(build._plan_parts(source, jobs=2)[1]) == 2       # no more parts than cores
        assert build._plan_parts(source, jobs=1) is None
        patch.setattr(build, "_PART_MIN_BYTES", 1000)               # 2.5 parts' worth: 2
        assert len(build._plan_parts(source, jobs=8)[1]) == 2
        patch.setattr(build, "_PART_MIN_BYTES", 10 ** 6)            # too small to split
        assert build._plan_parts(source, jobs=8) is None
    # a source without markers (written by hand) is one translation unit
    assert build._plan_parts("#include <x>\n" + "void f() {}\n" * 10 ** 5, jobs=8) is None


def test_small_generated_library_is_one_unit():
    """At the real threshold a library of a few kernels, or of 99% of graphs (under 200 KB),
    is one translation unit: each unit parses the headers again."""
    def library(count, size):
        return build.kernel_library_source(PRELUDE, [(name, text + "//" + "x" * size + "\n")
                                                     for name, text in map(_kernel, range(count))])
    assert build._plan_parts(library(40, 0), jobs=64) is None
    assert build._plan_parts(library(40, 5000), jobs=64) is None          # 200 KB
    assert len(build._plan_parts(library(40, 10000), jobs=64)[1]) == 2    # 400 KB
    assert len(build._plan_parts(library(40, 40000), jobs=64)[1]) == 8    # 1.6 MB
    assert len(build._plan_parts(library(40, 40000), jobs=2)[1]) == 2


def test_library_in_parts_exports_every_kernel(cache_dir, split):
    source, names = _library("parts", 7)
    builds = tritonfuse.metrics.cpp_builds
    result = build.build_kernel_library(source)
    assert result.compiled and tritonfuse.metrics.cpp_builds == builds + 1
    (prelude, parts), = split
    assert len(parts) == 3 and sorted(k.name for part in parts for k in part) == sorted(names)
    with open(result.cpp_path) as f:    # the whole source is kept, with its key marker
        assert f.read() == build._with_key_marker(source, result.key)
    a = torch.randn(101)
    for i, name in enumerate(names):
        kernel = build.KernelCallable(result.lib, name, argtypes=[ctypes.c_void_p] * 2 + [ctypes.c_int64])
        out = torch.empty_like(a)
        kernel(a.data_ptr(), out.data_ptr(), a.numel())
        torch.testing.assert_close(out, a * (i + 1) + 0.5 * i)
    assert _temp_files(cache_dir) == []
    # the key marker is in the linked library: a new process loads it from the disk cache
    del build._loaded[result.key]
    again = build.build_kernel_library(source)
    assert again.origin == "disk-cache" and again.so_path == result.so_path


def test_compile_error_in_one_part(cache_dir, split):
    source, names = _library("broken-part", 6, broken=4)
    builds = tritonfuse.metrics.cpp_builds
    with pytest.raises(build.CppCompileError) as info:
        build.load_kernel_library(source)
    err = info.value
    assert len(split[0][1]) == 3
    assert "this_name_is_undeclared_7" in err.stderr and "this_name_is_undeclared_7" in str(err)
    assert "part" in str(err) and names[4] in str(err)
    # the diagnostic names the kept kernel.cpp, at the line of the error there
    assert os.path.basename(err.cpp_path) == "kernel.cpp" and os.path.exists(err.cpp_path)
    with open(err.cpp_path) as f:
        line = next(n for n, text in enumerate(f, 1) if "this_name_is_undeclared_7" in text)
    assert f"{err.cpp_path}:{line}:" in err.stderr, err.stderr
    assert not os.path.exists(os.path.join(os.path.dirname(err.cpp_path), "kernel.so"))
    assert tritonfuse.metrics.cpp_builds == builds
    assert _temp_files(cache_dir) == []


def test_link_error_reports_stderr(cache_dir, split):
    """A prelude that defines an external symbol is in every part: the link fails, and
    says why."""
    kernels = [_kernel(i) for i in range(4)]
    source = build.kernel_library_source(f"// link pid={os.getpid()}\n{PRELUDE}int tf_test_duplicate = 1;\n", kernels)
    with pytest.raises(build.CppCompileError) as info:
        build.load_kernel_library(source)
    assert "tf_test_duplicate" in info.value.stderr and "link" in str(info.value)
    assert _temp_files(cache_dir) == []


def _many_kernels(*xs):
    outs = []
    for i, x in enumerate(xs):   # a shape each: kernels that do not fuse, nor share a body
        y = torch.sigmoid(x * (i + 1)) - x
        outs += [y, y.sum(-1), (x * x).amax(0), torch.cumsum(x, -1) if i % 3 == 0 else x.exp()]
    return outs


def test_compiled_graph_in_parts_matches_eager(cache_dir, split, monkeypatch):
    monkeypatch.setattr(tritonfuse.config, "cpu_backend", "cpp")
    xs = [torch.randn(5 + i, 33 + 2 * i) for i in range(6)]
    expected = _many_kernels(*xs)
    actual = torch.compile(_many_kernels, backend="tritonfuse", dynamic=False)(*xs)
    assert tritonfuse.metrics.eager_graphs == 0
    plans = [plan for plan in split if plan is not None]
    assert len(plans) == 1 and len(plans[0][1]) == 3, split
    assert sum(len(part) for part in plans[0][1]) == tritonfuse.metrics.generated_kernel_count > 6
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)
    assert _temp_files(cache_dir) == []
