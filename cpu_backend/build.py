"""Build and load generated C++ kernels: compiler discovery, flags, an on-disk build cache
shared between processes, and a low-overhead ctypes callable.

    lib = load_kernel_library(source)                # ctypes.CDLL, compiled at most once
    kernel = KernelCallable(lib, "cpp_fused_add_0", num_args=3)
    kernel(x.data_ptr(), y.data_ptr(), out.data_ptr())

Cache layout: ``<config.cache_dir>/cpp/<key[:2]>/<key>/{kernel.cpp, kernel.so}`` (each with
its cache_store size/hash record) where ``key = sha256(format, source, flags, compiler
identity, CPU, vector headers)``. Every file goes through tritonfuse.cache_store: a build
writes the .so to a temporary name and publishes it while holding the folder's lock, so a
second process building the same kernel waits and then loads the finished library. A .so
is handed to the dynamic loader only after its size and hash match its record (a
truncated library would die with SIGBUS, which nothing can catch); one that does not
match, or that the loader refuses, is deleted and built again in the same process.

Large libraries build in parallel. A generated source is a prelude (includes, and helpers
of internal linkage only) followed by its kernels, each opened by a marker line
(`kernel_library_source`). When the kernels add up to at least two parts' worth of
`_PART_MIN_BYTES`, they are dealt out, balanced by size, to up to one part per core; each
part (the prelude and its kernels, with #line directives that point diagnostics at the
kernel.cpp kept in the cache) compiles to an object file, all parts at once, and the
objects are linked into the one kernel.so. A source without markers is one translation
unit. The split does not enter the key: the library's kernels are the same either way.
"""
from __future__ import annotations

import concurrent.futures
import ctypes
import dataclasses
import functools
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import warnings
from typing import Sequence

from tritonfuse import cache_store

INCLUDE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "include")

# Compile flags. Deliberately absent: -ffast-math and its parts (-ffinite-math-only,
# -funsafe-math-optimizations, -fassociative-math): eager's NaN/Inf/-0 semantics must hold.
# -ffp-contract=off: a*b+c in generated code rounds twice, like eager's separate ops
# (the vector header asks for FMA explicitly where it wants one).
# -fwrapv: signed integer arithmetic wraps as two's complement, like eager; without it
# -O3 folds (x * 4) / 4 to x (signed overflow is undefined behaviour), vectors included.
_BASE_FLAGS = [
    "-O3",
    "-std=c++17",
    "-shared",
    "-fPIC",
    "-fopenmp",
    "-fno-finite-math-only",
    "-fno-math-errno",
    "-fno-strict-aliasing",
    "-ffp-contract=off",
    "-fwrapv",
    "-Wno-unused-variable",
    "-Wno-unused-but-set-variable",
    "-Wno-unused-function",
    "-Wno-unknown-pragmas",
    "-Wno-unused-label",
]
# Tried in order by the probe compile; the first the compiler accepts is used.
_ARCH_FLAG_CANDIDATES = [["-march=native"], ["-mcpu=native"], []]

_SO_NAME = "kernel.so"
_CPP_NAME = "kernel.cpp"
# Opens each kernel of a generated library source, at the start of a line (see
# `kernel_library_source`): where a large library may be split into translation units.
KERNEL_MARKER = "// tritonfuse-kernel "
# The least kernel source worth a translation unit of its own. Each unit parses the
# headers again: tf_kernel.h and the standard headers it includes are 2.9 MB preprocessed,
# 1.3-1.7 s of g++ -O3 for an empty kernel file (2-core AMD EPYC), and a busy machine pays
# that for nothing. Compile time is loosely tied to size: single-unit builds of generated
# libraries took 4-12 s of CPU at 100-200 KB (one outlier: 73 s at 164 KB, one kernel),
# 7-21 s at 200-410 KB, 66-69 s for RWKV training's 1.37 MB. From 2 x 192 KB on (99% of
# libraries are smaller), each part has some 5 s of work or more, three headers' worth.
_PART_MIN_BYTES = 192 * 1024
# In the dynamic loader's message when the process's libgomp is older than the compiler's.
_OPENMP_MISMATCH = "GOMP_"
# Part of every build key: bump when the layout of a build folder changes.
# 2: files written through cache_store, with size/hash records
# 3: records name their file (cache_store "tritonfuse-sum 2")
_BUILD_FORMAT = "3"


class CompilerNotFoundError(RuntimeError):
    """No usable C++ compiler (or no working OpenMP) for the CPU backend."""


class CppCompileError(RuntimeError):
    """The C++ compiler rejected a generated kernel; the message holds its stderr."""

    def __init__(self, message: str, cpp_path: str, stderr: str):
        super().__init__(message)
        self.cpp_path = cpp_path
        self.stderr = stderr


# ---------------------------------------------------------------------------------------
# Compiler discovery
# ---------------------------------------------------------------------------------------

_INSTALL_HINT = (
    "install one (Debian/Ubuntu: `apt-get install g++`; Fedora: `dnf install gcc-c++`; "
    "macOS: `xcode-select --install`), or point $CXX at a compiler, or set "
    "tritonfuse.config.cpu_backend = 'triton' to run CPU kernels through Triton instead"
)


def find_compiler() -> str:
    """The C++ compiler to use: ``$CXX`` if set (tritonfuse.config.cxx), else ``g++``, else
    ``clang++`` on PATH."""
    import tritonfuse.config as config

    if config.cxx:
        argv = shlex.split(config.cxx)
        if shutil.which(argv[0]) is None:
            raise CompilerNotFoundError(
                f"C++ compiler $CXX={config.cxx!r} not found (no executable {argv[0]!r}); the "
                f"tritonfuse CPU backend needs a C++17 compiler with OpenMP: {_INSTALL_HINT}"
            )
        return config.cxx
    for name in ("g++", "clang++"):
        path = shutil.which(name)
        if path is not None:
            return path
    raise CompilerNotFoundError(
        "No C++ compiler found: $CXX is unset and neither g++ nor clang++ is on PATH. The "
        f"tritonfuse CPU backend compiles OpenMP C++ kernels: {_INSTALL_HINT}"
    )


_identity_cache: dict[str, str] = {}
_state_lock = threading.Lock()


def compiler_identity(compiler: str) -> str:
    """First line of ``<compiler> --version`` (part of the build-cache key), cached."""
    if compiler not in _identity_cache:
        try:
            out = subprocess.run(
                shlex.split(compiler) + ["--version"], capture_output=True, text=True, timeout=60
            )
        except OSError as e:
            raise CompilerNotFoundError(f"cannot run C++ compiler {compiler!r}: {e}; {_INSTALL_HINT}") from e
        lines = (out.stdout or out.stderr).strip().splitlines()
        _identity_cache[compiler] = lines[0] if lines else compiler
    return _identity_cache[compiler]


@functools.lru_cache(maxsize=None)
def _cpu_identity() -> str:
    """-march=native code is only valid on the CPU it was built for: key on its model/flags."""
    ident = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    ident += "|" + line.strip()
                if line.strip() == "":  # first processor only
                    break
    except OSError:
        pass
    return ident


_PROBE_SOURCE = r"""
#include <omp.h>
extern "C" int tritonfuse_probe(void) {
    int n = 0;
#pragma omp parallel reduction(+ : n)
    n += 1;
    return n + omp_get_max_threads();
}
"""


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    arch_flags: tuple[str, ...]      # the -march spelling the compiler takes (maybe none)
    user_flags_rejection: str        # why the compiler rejects $TRITONFUSE_CXXFLAGS ("" if not)

    def to_json(self) -> str:
        return json.dumps({"arch_flags": list(self.arch_flags),
                           "user_flags_rejection": self.user_flags_rejection}, sort_keys=True)

    @classmethod
    def from_json(cls, text: bytes) -> "ProbeResult | None":
        """The result a record holds, or None if it is not one this version wrote."""
        try:
            data = json.loads(text)
            arch, rejection = data["arch_flags"], data["user_flags_rejection"]
        except (ValueError, TypeError, KeyError):
            return None
        if arch not in _ARCH_FLAG_CANDIDATES or not isinstance(rejection, str):
            return None
        return cls(tuple(arch), rejection)


_probe_cache: dict[tuple, ProbeResult] = {}
_warned_rejections: set[tuple] = set()


def _probe(compiler: str, user_flags: tuple[str, ...]) -> ProbeResult:
    """Check that OpenMP works, which -march spelling the compiler takes and whether it
    accepts $TRITONFUSE_CXXFLAGS: tiny test compiles, once per compiler, machine and user
    flags (remembered in memory and in a cache_store record, so a process that only loads
    cached kernels never runs them). Raises CompilerNotFoundError naming libgomp/libomp if
    -fopenmp fails."""
    import tritonfuse.config as config

    with _state_lock:
        if (compiler, user_flags) in _probe_cache:
            return _probe_cache[(compiler, user_flags)]
        ident = hashlib.sha256("\0".join([_BUILD_FORMAT, compiler, compiler_identity(compiler), _cpu_identity(),
                                          shlex.join(user_flags)]).encode())
        record = os.path.join(config.cache_dir, "cpp", f"probe-{ident.hexdigest()[:24]}.json")
        stored = cache_store.read(record)
        result = ProbeResult.from_json(stored) if stored is not None else None
        if stored is not None and result is None:
            cache_store.discard(record, "not a probe record of this version")
        if result is None:
            result = _run_probe(compiler, user_flags)
            try:
                cache_store.write(record, result.to_json())
            except OSError:
                pass  # no cache at all: probe again next process
        _probe_cache[(compiler, user_flags)] = result
        return result


def _run_probe(compiler: str, user_flags: tuple[str, ...]) -> ProbeResult:
    with tempfile.TemporaryDirectory(prefix="tritonfuse_probe_") as tmp:
        src = os.path.join(tmp, "probe.cpp")
        with open(src, "w") as f:
            f.write(_PROBE_SOURCE)

        def try_compile(flags):
            cmd = shlex.split(compiler) + [src, *flags, "-o", os.path.join(tmp, "probe.so")]
            return cmd, subprocess.run(cmd, capture_output=True, text=True)

        errors = []
        for arch in _ARCH_FLAG_CANDIDATES:
            cmd, res = try_compile(["-O1", "-shared", "-fPIC", "-fopenmp", *arch])
            if res.returncode == 0:
                break
            errors.append(f"$ {shlex.join(cmd)}\n{res.stderr.strip()}")
        else:
            raise CompilerNotFoundError(
                f"C++ compiler {compiler!r} cannot build an OpenMP shared library (-fopenmp failed). "
                "Install the OpenMP runtime: libgomp for g++ (`apt-get install libgomp1 g++`), "
                "libomp for clang++ (`apt-get install libomp-dev`, macOS: `brew install libomp`).\n"
                + "\n".join(errors)
            )
        rejection = ""
        if user_flags:   # with everything a kernel build uses, the kernel header included
            with open(src, "a") as f:
                f.write('#include "tf_kernel.h"\n')
            _, res = try_compile([*_BASE_FLAGS, *arch, "-I", INCLUDE_DIR, *user_flags])
            if res.returncode != 0:
                lines = [line for line in res.stderr.splitlines() if "error" in line]
                rejection = (lines or res.stderr.strip().splitlines() or [f"exit {res.returncode}"])[0]
    return ProbeResult(tuple(arch), rejection)


def compile_flags(compiler: str | None = None) -> list[str]:
    """Flags for a kernel build (without source/output), including $TRITONFUSE_CXXFLAGS
    (tritonfuse.config.cxxflags) unless the compiler rejects them: then they are left out,
    with a SettingWarning once per process."""
    import tritonfuse.config as config

    compiler = compiler or find_compiler()
    user_flags = tuple(config.cxxflags)
    probe = _probe(compiler, user_flags)
    flags = list(_BASE_FLAGS) + list(probe.arch_flags) + ["-I", INCLUDE_DIR]
    if not probe.user_flags_rejection:
        return flags + list(user_flags)
    if (compiler, user_flags) not in _warned_rejections:
        _warned_rejections.add((compiler, user_flags))
        warnings.warn(f"tritonfuse: TRITONFUSE_CXXFLAGS={shlex.join(user_flags)!r} is rejected by "
                      f"{compiler} ({probe.user_flags_rejection}); building kernels without them",
                      config.SettingWarning, stacklevel=2)
    return flags


_header_digest: str | None = None


def _headers_digest() -> str:
    global _header_digest
    if _header_digest is None:
        h = hashlib.sha256()
        for name in sorted(os.listdir(INCLUDE_DIR)):
            with open(os.path.join(INCLUDE_DIR, name), "rb") as f:
                h.update(name.encode() + b"\0" + f.read() + b"\0")
        _header_digest = h.hexdigest()
    return _header_digest


# ---------------------------------------------------------------------------------------
# Build + load
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BuildResult:
    lib: ctypes.CDLL
    key: str
    so_path: str
    cpp_path: str
    # "compiled" (this call ran the compiler), "disk-cache" (loaded a .so another call or
    # process built), "memory" (the same source was already loaded in this process).
    origin: str

    @property
    def compiled(self) -> bool:
        return self.origin == "compiled"


_loaded: dict[str, BuildResult] = {}  # key -> result, so one source is dlopened once


def build_kernel_library(source: str, extra_flags: Sequence[str] = ()) -> BuildResult:
    """Compile ``source`` to a shared library (or find it in the build cache) and load it.
    ``extra_flags`` are appended to ``compile_flags()`` (and are part of the cache key).
    Thread-safe; threads building different sources compile in parallel."""
    import tritonfuse.config as config
    import tritonfuse.metrics as metrics

    compiler = find_compiler()
    flags = compile_flags(compiler) + list(extra_flags)
    key_material = "\0".join(
        [_BUILD_FORMAT, source, shlex.join(flags), compiler_identity(compiler), _cpu_identity(),
         _headers_digest()]
    )
    key = hashlib.sha256(key_material.encode()).hexdigest()
    hit = _loaded.get(key)
    if hit is not None:
        return dataclasses.replace(hit, origin="memory")
    folder = os.path.join(config.cache_dir, "cpp", key[:2], key)
    with cache_store.lock(folder):   # threads and processes building this kernel wait here
        hit = _loaded.get(key)
        if hit is not None:
            return dataclasses.replace(hit, origin="memory")
        result = _load_cached(key, folder) or _build(compiler, flags, source, key, folder)
        if result.compiled:
            metrics.cpp_builds += 1
        else:
            metrics.cpp_build_cache_hits += 1
        _loaded[key] = result
        return result


def _key_marker(key: str) -> bytes:
    """The string every library carries (see `_with_key_marker`) to say which build it is."""
    return f"tritonfuse-build-key:{key}".encode()


def _with_key_marker(source: str, key: str) -> str:
    """`source` with the marker of its build key: a library that is sound (it matches its
    size/hash record) but was built for another key, copied over with its record, is
    refused before the dynamic loader sees it; its kernels may bear the same names as
    this key's, for other sizes."""
    return f'{source}\nextern "C" const char tritonfuse_build_key[] = "{_key_marker(key).decode()}";\n'


def _load_cached(key: str, folder: str) -> BuildResult | None:
    """The verified library in `folder`, loaded; None if absent, damaged, built for another
    key or refused by the dynamic loader (then deleted, to be built again)."""
    so_path = os.path.join(folder, _SO_NAME)
    data = cache_store.read(so_path)
    if data is None:
        return None
    if _key_marker(key) not in data:
        cache_store.discard(so_path, "it is the library of another build (copied from another entry?)")
        return None
    try:
        lib = _dlopen(so_path)
    except CppCompileError as error:
        if _OPENMP_MISMATCH in error.stderr:   # the process, not the file, is at fault
            raise
        cache_store.discard(so_path, f"the dynamic loader refused it: {error.stderr}")
        return None
    return BuildResult(lib, key, so_path, os.path.join(folder, _CPP_NAME), "disk-cache")


def _build(compiler: str, flags: list[str], source: str, key: str, folder: str) -> BuildResult:
    import tritonfuse.config as config

    cache_store.sweep_once(config.cache_dir)   # the cold path: litter of killed builds
    cpp_path, so_path = _compile(compiler, flags, _with_key_marker(source, key), os.path.join(folder, _CPP_NAME),
                                 os.path.join(folder, _SO_NAME))
    return BuildResult(_dlopen(so_path), key, so_path, cpp_path, "compiled")


def _dlopen(so_path: str) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(so_path)
    except OSError as e:
        hint = ""
        if _OPENMP_MISMATCH in str(e):
            # libgomp is loaded once per process (torch ships its own copy): an OpenMP
            # construct that needs a newer libgomp than the one already loaded fails here.
            hint = " (the OpenMP runtime already loaded, usually torch's bundled libgomp, is older than the compiler's)"
        raise CppCompileError(f"cannot load compiled kernel {so_path}: {e}{hint}",
                              os.path.join(os.path.dirname(so_path), _CPP_NAME), str(e)) from e


def load_kernel_library(source: str, extra_flags: Sequence[str] = ()) -> ctypes.CDLL:
    """The loaded library for ``source``; see ``build_kernel_library`` for build details."""
    return build_kernel_library(source, extra_flags).lib


def _compile(compiler: str, flags: list[str], source: str, cpp_path: str, so_path: str) -> tuple[str, str]:
    """Compile `source` into the library `so_path`, in parallel parts if it is large (see
    `_plan_parts`); returns where the source and the library now live (private twins if the
    cache folder cannot be written)."""
    cpp_path = cache_store.write(cpp_path, source)  # kept next to the .so for debugging
    parts = _plan_parts(source, _parallel_jobs())
    tmp_so = cache_store.temp_path(so_path, ".so")
    temps = [tmp_so]
    try:
        if parts is None:
            cmd = shlex.split(compiler) + [cpp_path, *flags, "-o", tmp_so]
            _run_compiler(cmd, cpp_path, "compilation")
        else:
            objects = _compile_parts(compiler, flags, parts, cpp_path, so_path, temps)
            cmd = shlex.split(compiler) + [*objects, *flags, "-o", tmp_so]
            _run_compiler(cmd, cpp_path, f"link of the {len(objects)} parts")
        return cpp_path, cache_store.publish(tmp_so, so_path)
    finally:
        for path in temps:
            if os.path.exists(path):
                os.unlink(path)


def _run_compiler(cmd: list[str], cpp_path: str, what: str) -> None:
    """Run the compiler; CppCompileError with its stderr if it fails."""
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise CppCompileError(
            f"C++ {what} of {cpp_path} failed (exit {res.returncode}).\n"
            f"$ {shlex.join(cmd)}\n{res.stderr}",
            cpp_path,
            res.stderr,
        )


@dataclasses.dataclass(frozen=True)
class _Kernel:
    name: str
    line: int     # where its marker stands in the whole source (1-based)
    text: str     # from its marker to the next one


def kernel_library_source(prelude: str, kernels: Sequence[tuple[str, str]]) -> str:
    """The source of a library of `kernels` ((name, source) pairs) after `prelude`, each
    kernel opened by its marker line. A build may compile it in several translation units,
    each with the prelude and some of the kernels: the prelude must define no symbol of
    external linkage (includes, static or inline helpers), and each kernel only its own."""
    return prelude + "".join(f"\n{KERNEL_MARKER}{name}\n{text}" for name, text in kernels)


def _split_kernels(source: str) -> tuple[str, list[_Kernel]]:
    """(prelude, kernels) of a source made by `kernel_library_source`; (source, []) for
    one without markers."""
    starts = [m.start() for m in re.finditer("^" + re.escape(KERNEL_MARKER), source, re.M)]
    if not starts:
        return source, []
    kernels = []
    for start, end in zip(starts, starts[1:] + [len(source)]):
        text = source[start:end]
        name = text[len(KERNEL_MARKER):].split("\n", 1)[0].strip()
        kernels.append(_Kernel(name, source.count("\n", 0, start) + 1, text))
    return source[:starts[0]], kernels


def _parallel_jobs() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # not Linux
        return os.cpu_count() or 1


def _plan_parts(source: str, jobs: int) -> tuple[str, list[list[_Kernel]]] | None:
    """(prelude, the kernels of each part) for a source worth compiling in parts: at most
    `jobs` parts, each of at least `_PART_MIN_BYTES` of kernels on average; None for one
    translation unit. Longest kernels first, each to the part with the least source so
    far; a part keeps its kernels in source order."""
    prelude, kernels = _split_kernels(source)
    count = min(jobs, len(kernels), sum(len(k.text) for k in kernels) // _PART_MIN_BYTES)
    if count < 2:
        return None
    sizes, members = [0] * count, [[] for _ in range(count)]
    for index in sorted(range(len(kernels)), key=lambda i: -len(kernels[i].text)):
        lightest = sizes.index(min(sizes))
        sizes[lightest] += len(kernels[index].text)
        members[lightest].append(index)
    return prelude, [[kernels[i] for i in sorted(part)] for part in members]


def _part_source(prelude: str, kernels: list[_Kernel], cpp_path: str) -> str:
    """One translation unit: the prelude and `kernels`, each placed by #line where it stands
    in `cpp_path` (the whole source), so that diagnostics name that file and line."""
    name = '"' + cpp_path.replace("\\", "\\\\").replace('"', '\\"') + '"'
    pieces = [f"#line 1 {name}\n", prelude]
    for kernel in kernels:
        pieces += [f"#line {kernel.line} {name}\n", kernel.text if kernel.text.endswith("\n") else kernel.text + "\n"]
    return "".join(pieces)


def _compile_parts(compiler: str, flags: list[str], parts: tuple[str, list[list[_Kernel]]], cpp_path: str,
                   so_path: str, temps: list[str]) -> list[str]:
    """Compile each part to an object file, all at once; returns the objects. Every file
    made is added to `temps` (the caller deletes them)."""
    prelude, groups = parts
    object_flags = [flag for flag in flags if flag != "-shared"]   # objects, linked later
    jobs = []
    for group in groups:
        part_cpp = cache_store.temp_path(so_path, ".cpp")
        temps.append(part_cpp)
        with open(part_cpp, "w") as f:
            f.write(_part_source(prelude, group, cpp_path))
        obj = cache_store.temp_path(so_path, ".o")
        temps.append(obj)
        jobs.append((shlex.split(compiler) + [part_cpp, *object_flags, "-c", "-o", obj], obj, group))
    with concurrent.futures.ThreadPoolExecutor(len(jobs), thread_name_prefix="tritonfuse-cxx") as pool:
        results = list(pool.map(lambda job: subprocess.run(job[0], capture_output=True, text=True), jobs))
    failed = [(i, res) for i, res in enumerate(results) if res.returncode != 0]
    if failed:
        i, res = failed[0]
        cmd, _, group = jobs[i]
        names = ", ".join(kernel.name for kernel in group)
        others = f"; {len(failed) - 1} more part(s) failed too" if len(failed) > 1 else ""
        raise CppCompileError(
            f"C++ compilation of {cpp_path} failed (exit {res.returncode}; part {i + 1} of {len(jobs)}, "
            f"kernels {names}{others}).\n$ {shlex.join(cmd)}\n{res.stderr}",
            cpp_path,
            res.stderr,
        )
    return [obj for _, obj, _ in jobs]


# ---------------------------------------------------------------------------------------
# Calling kernels
# ---------------------------------------------------------------------------------------


class KernelCallable(ctypes._CFuncPtr):
    """``extern "C" void fn(void*, void*, ...)`` in a loaded library, called with integer
    addresses: ``kernel(t0.data_ptr(), t1.data_ptr(), ...)``.

    It *is* the ctypes function pointer (a subclass, argtypes set once), so a call costs
    exactly one ctypes foreign call, with no Python-level wrapper frame in between.
    ``argtypes`` may replace the all-``c_void_p`` default (e.g. ``ctypes.c_int64`` for a
    size argument). ``returns_int``: the function returns an ``int`` (kernels with integer
    divisions return whether one met a zero divisor)."""

    _flags_ = ctypes._FUNCFLAG_CDECL
    _restype_ = None

    def __new__(cls, lib: ctypes.CDLL, name: str, num_args: int | None = None, argtypes=None,
                returns_int: bool = False):
        self = super().__new__(cls, (name, lib))
        if argtypes is None:
            if num_args is None:
                raise TypeError("KernelCallable needs num_args or argtypes")
            argtypes = [ctypes.c_void_p] * num_args
        self.argtypes = list(argtypes)
        self.restype = ctypes.c_int if returns_int else None
        self.kernel_name = name
        return self

    def __init__(self, *args, **kwargs):  # all set up in __new__
        pass

    def call_tensors(self, *tensors) -> None:
        """Convenience (slower) form: pass tensors, their data pointers are taken here."""
        self(*[t.data_ptr() for t in tensors])

    def __repr__(self) -> str:
        return f"KernelCallable({self.kernel_name!r}, num_args={len(self.argtypes)})"


def default_num_threads() -> int:
    """Threads a kernel's OpenMP regions should use: the same as eager (torch's setting)."""
    import torch

    return torch.get_num_threads()
