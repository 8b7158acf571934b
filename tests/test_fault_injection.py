"""Fault injection: damage the on-disk cache the way crashes, full disks and people do, then
run the compiled function in a fresh process and require the right answer, no graph run
eagerly (metrics.eager_graphs == 0) and the damaged file rebuilt.

The function is the one of issue 16, ``softmax(x * y + 1, -1).sum(0) + sigmoid(y).mean()``
on 64x128 float32, on both CPU backends: ``cpp`` (OpenMP C++: graph modules, C++ sources
and libraries, compiler probe records) and ``triton`` (Triton kernels run by Triton's
interpreter: graph modules, kernel files and, through a second small function whose launch
config is tuned, autotune records). Also here: a folder or a pipe where a file should be,
threads meeting new shapes in two processes that share one cache (the cache they leave
must verify and load), a bad value of every setting, the autotune CLI on an unusable cache
location, stale temporary files swept.

chmod does not keep root from reading a file, so when the tests run as root the cases
that need permissions to bite run their processes as the user nobody (uid 65534); where
that is impossible they are skipped, saying why.
"""
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
import torch

from autotune_cache.__main__ import main as cli_main
from tritonfuse import cache_store, config, metrics

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOBODY = 65534
BACKENDS = ["cpp", "triton"]

RUNNER = r'''
import json
import torch
import tritonfuse
from tritonfuse import config, metrics
from tritonfuse.runtime import autotuner


def f(x, y):
    return torch.softmax(x * y + 1, -1).sum(0) + torch.sigmoid(y).mean()


def g(x):   # one pointwise kernel, quick to tune under the interpreter: an autotune record
    return torch.sigmoid(x * 2 + 1)


torch.manual_seed(0)
x, y = torch.randn(64, 128), torch.randn(64, 128)
problems = []
try:
    torch.testing.assert_close(torch.compile(f, backend="tritonfuse")(x, y), f(x, y))
    if config.cpu_backend == "triton":
        config.autotune_under_interpreter = True
        config.autotune = "max"      # the full search: the default budget may tune nothing this small
        torch.testing.assert_close(torch.compile(g, backend="tritonfuse")(x), g(x))
except AssertionError as error:
    problems.append(str(error))
print(json.dumps({"problems": problems, "eager_graphs": metrics.eager_graphs,
                  "cache_repairs": metrics.cache_repairs,
                  "graph_cache_hits": metrics.graph_cache_hits, "tuned": autotuner.stats.tuned}))
'''


# --- running the function in a fresh process ------------------------------------------------

def _as_nobody(argv):
    """`argv` run as the user nobody (through setpriv: a child that drops root by itself
    cannot exec a python that lives under /root, as on this machine)."""
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]


def _nobody_problem():
    """Why processes cannot run as nobody here (None if they can)."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("setpriv") is None:
        return "setpriv is not installed"
    argv = _as_nobody([sys.executable, "-c", f"import sys; sys.path.insert(0, {REPO!r}); import tritonfuse"])
    done = subprocess.run(argv, cwd="/", capture_output=True, text=True, timeout=300)
    return None if done.returncode == 0 else f"nobody cannot import tritonfuse: {done.stderr[-300:]}"


_NOBODY_PROBLEM = _nobody_problem()


def _needs_permissions_to_bite():
    """Run as nobody when root (chmod does not stop root); skip if that is impossible."""
    if os.geteuid() != 0:
        return False
    if _NOBODY_PROBLEM is not None:
        pytest.skip(f"running as root, and {_NOBODY_PROBLEM}: chmod would not stop root from reading")
    return True


class Case:
    """One scenario's folders: cache/, autotune/, home/ (HOME), work/ (the working folder)."""

    def __init__(self, root):
        self.root = root
        self.cache, self.autotune = os.path.join(root, "cache"), os.path.join(root, "autotune")
        self.home, self.work = os.path.join(root, "home"), os.path.join(root, "work")
        for folder in (self.home, self.work):
            os.makedirs(folder, exist_ok=True)

    def give_to_nobody(self):
        for folder, dirs, files in os.walk(self.root):
            for name in [folder] + [os.path.join(folder, n) for n in dirs + files]:
                os.lchown(name, NOBODY, NOBODY)

    def env(self, backend, **env_extra):
        """The environment of a process of this case: its folders, `backend`, no other knob."""
        env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   HOME=self.home, TRITON_CACHE_DIR=os.path.join(self.home, "triton"),
                   TRITONFUSE_CACHE_DIR=self.cache, TRITONFUSE_AUTOTUNE_CACHE_DIR=self.autotune,
                   TRITONFUSE_CPU_BACKEND=backend)
        for name in ("TRITONFUSE_AUTOTUNE", "TRITONFUSE_AUTOTUNE_INTERPRET", "TRITONFUSE_GRAPH_CACHE",
                     "TRITON_INTERPRET", "CXX", "TRITONFUSE_CXXFLAGS", "XDG_CACHE_HOME"):
            env.pop(name, None)
        env.update(env_extra)
        return env

    def run(self, backend, as_nobody=False, runner=RUNNER, **env_extra):
        """The `runner` script's report; the process must exit normally (no SIGBUS, no traceback)."""
        env = self.env(backend, **env_extra)
        script = os.path.join(self.root, "runner.py")
        with open(script, "w") as f:
            f.write(runner)
        os.chmod(script, 0o644)
        argv = [sys.executable, script]
        done = subprocess.run(_as_nobody(argv) if as_nobody else argv, cwd=self.work, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"exit {done.returncode}\n{done.stderr[-3000:]}"
        self.stderr = done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])


def _assert_heals(report, stderr=""):
    assert report["problems"] == [], report["problems"]
    assert report["eager_graphs"] == 0, stderr[-3000:]
    assert report["cache_repairs"] >= 1, stderr[-3000:]


@pytest.fixture(scope="module")
def scratch():
    """A folder nobody can reach (pytest's own tmp folders are private to their owner)."""
    root = tempfile.mkdtemp(prefix="tritonfuse-faults-")
    os.chmod(root, 0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def warm(scratch):
    """backend -> a Case whose caches hold everything the runner compiles."""
    cases = {}
    for backend in BACKENDS:
        case = Case(os.path.join(scratch, f"warm-{backend}"))
        report = case.run(backend)
        assert report["problems"] == [] and report["eager_graphs"] == 0 and report["cache_repairs"] == 0
        cases[backend] = case
    return cases


_counter = iter(range(10 ** 6))


def copy_of(warm_case, scratch):
    case = Case(os.path.join(scratch, f"case-{next(_counter)}"))
    for name in ("cache", "autotune"):
        source = os.path.join(warm_case.root, name)
        if os.path.isdir(source):
            shutil.copytree(source, os.path.join(case.root, name), dirs_exist_ok=True)
    return case


# --- the files and the ways to damage them --------------------------------------------------

KINDS = {   # kind -> glob under a Case's root
    "graph module": "cache/graphs/*/g*.py",
    "graph meta": "cache/graphs/*/g*.json",
    "C++ library": "cache/cpp/*/*/kernel.so",
    "C++ source": "cache/cpp/*/*/kernel.cpp",
    "compiler probe record": "cache/cpp/probe-*.json",
    "Triton kernel file": "cache/kernels/*/*.py",
    "autotune record": "autotune/*.json",
    "size/hash record of a C++ library": "cache/cpp/*/*/kernel.so.sum",
    "size/hash record of a graph module": "cache/graphs/*/g*.py.sum",
    "aot_autograd entry": "cache/aot/*/a*.pkl",
}
# The kinds a warm process reads (kernel.cpp is kept for people; a rebuild rewrites it).
READ_KINDS = {"cpp": ["graph module", "graph meta", "C++ library", "compiler probe record", "aot_autograd entry"],
              "triton": ["graph module", "graph meta", "Triton kernel file", "autotune record", "aot_autograd entry"]}


def files_of(case, kind):
    found = sorted(glob.glob(os.path.join(case.root, KINDS[kind])))
    assert found, f"no {kind} in {case.root}"
    return found


def cut_short(path):
    os.truncate(path, os.path.getsize(path) // 2)


def emptied(path):
    os.truncate(path, 0)


def random_bytes(path):
    with open(path, "wb") as f:
        f.write(os.urandom(max(os.path.getsize(path), 64)))


def unreadable(path):
    os.chmod(path, 0)


def folder_in_its_place(path):
    os.unlink(path)
    os.makedirs(os.path.join(path, "inside"))


DAMAGES = {"cut short": cut_short, "emptied": emptied, "random bytes": random_bytes,
           "unreadable": unreadable, "a folder in its place": folder_in_its_place}


def assert_rebuilt(path, original: bytes):
    """The file is back: it matches its record (or, for a kernel file, its source)."""
    if path.endswith(cache_store.RECORD_SUFFIX):
        path = path[:-len(cache_store.RECORD_SUFFIX)]
        original = None
    data, why = cache_store.check(path)
    if "/kernels/" in path:
        with open(path, "rb") as f:
            data, why = f.read(), None
        assert data == original, f"{path} does not hold its kernel source again"
    assert why is None, f"{path} was not rebuilt: {why}"


# --- every file a process reads, damaged at once, in each way ---------------------------------

@pytest.mark.parametrize("damage", list(DAMAGES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_cache_file_damaged_at_once(warm, scratch, backend, damage):
    as_nobody = damage == "unreadable" and _needs_permissions_to_bite()
    case = copy_of(warm[backend], scratch)
    if as_nobody:
        case.give_to_nobody()
    damaged = {path: open(path, "rb").read() for kind in READ_KINDS[backend] for path in files_of(case, kind)}
    for path in damaged:
        DAMAGES[damage](path)
    report = case.run(backend, as_nobody=as_nobody)
    _assert_heals(report, case.stderr)
    if backend == "triton":
        assert report["tuned"] == 1          # the damaged autotune record was tuned again
    for path, original in damaged.items():
        assert_rebuilt(path, original)


# --- one entry at a time: each heals on the path that reads it ---------------------------------

ONE_ENTRY = [   # (backend, [(kind, damage)]): issue 16's cases first; files of unrelated
                # entries share a process, to keep the module quick
    ("cpp", [("C++ library", "cut short"),               # was SIGBUS in every later process
             ("compiler probe record", "random bytes")]),
    ("triton", [("Triton kernel file", "random bytes"), ("autotune record", "emptied")]),
    ("cpp", [("size/hash record of a C++ library", "random bytes")]),
    ("cpp", [("graph meta", "cut short"),
             ("C++ source", "random bytes")]),           # kept for people: never read
    ("cpp", [("size/hash record of a graph module", "emptied")]),
    ("triton", [("graph module", "random bytes")]),
    ("cpp", [("aot_autograd entry", "cut short")]),
]
NOT_READ = {"C++ source"}


@pytest.mark.parametrize("backend,damages", ONE_ENTRY,
                         ids=[f"{b}-" + "+".join(f"{k}-{d}" for k, d in ds) for b, ds in ONE_ENTRY])
def test_one_damaged_entry_is_rebuilt(warm, scratch, backend, damages):
    case = copy_of(warm[backend], scratch)
    damaged = {}
    for kind, damage in damages:
        path = files_of(case, kind)[0]
        if kind not in NOT_READ:
            damaged[path] = open(path, "rb").read()
        DAMAGES[damage](path)
    report = case.run(backend)
    _assert_heals(report, case.stderr)
    kinds = {kind for kind, _ in damages}
    if not any("graph" in kind for kind in kinds):
        assert report["graph_cache_hits"] >= 1    # healed under a graph loaded from the cache
    if "autotune record" in kinds:
        assert report["tuned"] == 1
    for path, original in damaged.items():
        assert_rebuilt(path, original)


# --- a cache that cannot be written ---------------------------------------------------------

def test_cache_location_is_a_plain_file(scratch):
    case = Case(os.path.join(scratch, f"case-{next(_counter)}"))
    with open(case.cache, "w") as f:
        f.write("not a folder")
    report = case.run("cpp")   # everything goes to a private folder, with a warning
    assert report["problems"] == [] and report["eager_graphs"] == 0
    assert "cannot write the cache folder" in case.stderr


def test_damaged_entry_in_a_read_only_cache(warm, scratch):
    as_nobody = _needs_permissions_to_bite()
    case = copy_of(warm["cpp"], scratch)
    for kind in ("graph module", "C++ library"):
        cut_short(files_of(case, kind)[0])
    if as_nobody:
        case.give_to_nobody()
    for folder, _, _ in os.walk(case.cache):
        os.chmod(folder, 0o555)
    try:
        report = case.run("cpp", as_nobody=as_nobody)   # cannot delete: rebuilt privately
    finally:
        for folder, _, _ in os.walk(case.cache):
            os.chmod(folder, 0o755)
    _assert_heals(report, case.stderr)


# --- stale temporary files --------------------------------------------------------------------

def test_stale_temporary_files_are_swept_by_the_next_compile(warm, scratch):
    case = copy_of(warm["cpp"], scratch)
    build_folder = os.path.dirname(files_of(case, "C++ library")[0])
    orphan = os.path.join(build_folder, ".tmp_killedbuild.so")   # what a killed build leaves
    fresh = os.path.join(build_folder, ".tmp_buildinprogress.so")
    for path in (orphan, fresh):
        with open(path, "wb") as f:
            f.write(b"\x7fELF partial")
    day_ago = time.time() - 24 * 3600
    os.utime(orphan, (day_ago, day_ago))
    module = files_of(case, "graph module")[0]
    original = open(module, "rb").read()
    emptied(module)                     # issue 16's case; and this process compiles: the cold path
    _assert_heals(case.run("cpp"), case.stderr)
    assert_rebuilt(module, original)
    assert not os.path.exists(orphan)
    assert os.path.exists(fresh)    # may belong to a build in another process


TWO_GRAPHS_RUNNER = r'''
import json
import torch
import tritonfuse
from tritonfuse import metrics

torch.manual_seed(0)
x, y = torch.randn(64, 128), torch.randn(64, 128)
problems = []
for fn in (lambda x, y: torch.relu(x * y + 1) * 2, lambda x, y: torch.sigmoid(x - y) * 3 + x):
    try:
        torch.testing.assert_close(torch.compile(fn, backend="tritonfuse")(x, y), fn(x, y))
    except AssertionError as error:
        problems.append(str(error))
print(json.dumps({"problems": problems, "eager_graphs": metrics.eager_graphs,
                  "cache_repairs": metrics.cache_repairs}))
'''


def test_an_entry_copied_with_its_record_over_another_is_rebuilt(scratch):
    """Two graphs' modules swapped together with their size/hash records: each is a sound
    file, of the wrong graph (this gave the other graph's results). Records name their
    file, so both fail the check and are rebuilt."""
    case = Case(os.path.join(scratch, f"case-{next(_counter)}"))
    assert case.run("cpp", runner=TWO_GRAPHS_RUNNER) == {"problems": [], "eager_graphs": 0, "cache_repairs": 0}
    first, second = files_of(case, "graph module")
    for suffix in ("", cache_store.RECORD_SUFFIX):
        os.rename(first + suffix, first + suffix + ".swap")
        os.rename(second + suffix, first + suffix)
        os.rename(first + suffix + ".swap", second + suffix)
    report = case.run("cpp", runner=TWO_GRAPHS_RUNNER)
    assert report["problems"] == [] and report["eager_graphs"] == 0, case.stderr[-3000:]
    assert report["cache_repairs"] == 2 and "copied from another entry" in case.stderr


def test_a_record_names_its_file(tmp_path):
    one, other = str(tmp_path / "gone.py"), str(tmp_path / "gother.py")
    cache_store.write(one, b"first")
    cache_store.write(other, b"second")
    shutil.copy(other, one)
    shutil.copy(other + cache_store.RECORD_SUFFIX, one + cache_store.RECORD_SUFFIX)
    data, why = cache_store.check(one)
    assert data is None and "record of 'gother.py'" in why
    assert cache_store.check(other) == (b"second", None)


@pytest.mark.parametrize("intruder", ["folder", "pipe", "symlink to a folder"])
def test_a_non_file_in_place_of_an_entry_is_removed_not_read(tmp_path, intruder):
    """What stands where a file should be and is no regular file is never read (a pipe
    with no writer would block forever) and is removed, so the file can be written again."""
    path = str(tmp_path / "entry.bin")
    cache_store.write(path, b"payload")
    os.unlink(path)
    if intruder == "folder":
        os.makedirs(os.path.join(path, "inside"))
    elif intruder == "pipe":
        os.mkfifo(path)
    else:
        os.makedirs(tmp_path / "elsewhere")
        os.symlink(tmp_path / "elsewhere", path)
    repairs = metrics.cache_repairs
    assert cache_store.read(path) is None
    assert not os.path.lexists(path) and metrics.cache_repairs == repairs + 1
    assert (tmp_path / "elsewhere").exists() or intruder != "symlink to a folder"   # not followed
    assert cache_store.write(path, b"payload") == path and cache_store.read(path) == b"payload"


def test_sweep_spares_folders_whose_lock_is_held(tmp_path):
    folder = tmp_path / "cpp" / "ab" / "key"
    folder.mkdir(parents=True)
    stale = folder / ".tmp_old.so"
    stale.write_bytes(b"x")
    os.utime(stale, (0, 0))
    with cache_store.lock(str(folder)):        # a build in progress (the lock is per open file)
        assert cache_store.sweep(str(tmp_path)) == 0
    assert stale.exists()
    assert cache_store.sweep(str(tmp_path)) == 1
    assert not stale.exists()


# --- a cached graph whose generated code fails on its first call ------------------------------

@pytest.mark.parametrize("dynamic", [False, True], ids=["static", "symbolic"])
def test_cached_graph_failing_on_first_call_is_compiled_again(device, monkeypatch, tmp_path, dynamic):
    """A damage no size/hash record shows (the code of the graph is consistent with its
    record but its kernel is broken): the first call fails, the cached graph is thrown
    away and compiled afresh at call time (for symbolic sizes too, adding no guard), and
    no graph runs eagerly."""
    def f(x, y):
        return torch.softmax(x * y + 1, -1).sum(0) + torch.sigmoid(y).mean()

    monkeypatch.setattr(config, "cache_dir", str(tmp_path))
    x, y = torch.randn(64, 128, device=device), torch.randn(64, 128, device=device)
    torch.testing.assert_close(torch.compile(f, backend="tritonfuse", dynamic=dynamic)(x, y), f(x, y))
    assert metrics.eager_graphs == 0
    modules = glob.glob(os.path.join(config.cache_dir, "graphs", "*", "g*.py"))
    assert len(modules) == 1
    newest = modules[0]
    broken = open(newest).read() + "\n\ndef call(args):\n    raise RuntimeError('a broken kernel')\n"
    cache_store.write(newest, broken)
    torch._dynamo.reset()
    metrics.reset()
    compiled = torch.compile(f, backend="tritonfuse", dynamic=dynamic)
    torch.testing.assert_close(compiled(x, y), f(x, y))
    assert metrics.eager_graphs == 0 and metrics.cache_repairs >= 1
    if not dynamic:
        # loaded through the aot cache (aot_cache.py): compiled again for this process only,
        # the graph and the aot entry deleted; the next compile of the Dynamo graph writes both
        assert metrics.aot_cache_hits == 1 and not os.path.exists(newest)
        assert not glob.glob(os.path.join(config.cache_dir, "aot", "*", "a*.pkl"))
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(f, backend="tritonfuse")(x, y), f(x, y))
        assert metrics.eager_graphs == 0
        assert len(glob.glob(os.path.join(config.cache_dir, "aot", "*", "a*.pkl"))) == 1
    assert "a broken kernel" not in open(newest).read() and cache_store.check(newest)[1] is None
    with open(newest[:-3] + ".json") as handle:
        assert json.load(handle)["symbolic"] == dynamic      # rebuilt as it was first built
    if dynamic:    # the rebuilt graph serves other sizes, with no recompile
        x2, y2 = torch.randn(48, 128, device=device), torch.randn(48, 128, device=device)
        torch.testing.assert_close(compiled(x2, y2), f(x2, y2))
        assert metrics.eager_graphs == 0 and len(glob.glob(os.path.join(config.cache_dir, "graphs", "*", "g*.py"))) == 1


# --- threads meeting new shapes, and processes sharing one cache -----------------------------

THREADS_RUNNER = r'''
import json
import threading
import torch
from tritonfuse import metrics


def f(x, y):
    return torch.softmax(x * y + 1, -1).sum(0) + torch.sigmoid(y).mean()


def warm_fn(a):
    return torch.relu(a) * 2 + 1


torch.manual_seed(0)
THREADS = 8
problems = []
compiled_f = torch.compile(f, backend="tritonfuse")
warm = torch.compile(warm_fn, backend="tritonfuse")
x0, y0 = torch.randn(64, 128), torch.randn(64, 128)
a = torch.randn(16, 16)
torch.testing.assert_close(compiled_f(x0, y0), f(x0, y0))
torch.testing.assert_close(warm(a), warm_fn(a))
inputs = [(torch.randn(65 + 7 * i, 128), torch.randn(65 + 7 * i, 128)) for i in range(THREADS)]
start = threading.Barrier(THREADS)


def work(i):
    try:
        start.wait()
        for _ in range(2):
            torch.testing.assert_close(compiled_f(*inputs[i]), f(*inputs[i]))
            torch.testing.assert_close(warm(a), warm_fn(a))
    except BaseException as error:
        problems.append(f"{type(error).__name__}: {error}")


threads = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
fx_tracing = torch.fx._symbolic_trace._is_fx_tracing_flag
try:    # compiling still works afterwards
    g = lambda t: torch.cos(t) + 1
    t = torch.randn(5, 7)
    torch.testing.assert_close(torch.compile(g, backend="tritonfuse")(t), g(t))
except BaseException as error:
    problems.append(f"a later compile: {type(error).__name__}: {error}")
print(json.dumps({"problems": problems, "eager_graphs": metrics.eager_graphs, "fx_tracing": fx_tracing,
                  "cache_repairs": metrics.cache_repairs, "graph_cache_hits": metrics.graph_cache_hits}))
'''


def _run_together(case, count, script):
    """`count` processes running `script` at once on the case's caches; their reports."""
    with open(os.path.join(case.root, "threads.py"), "w") as f:
        f.write(script)
    env = case.env("cpp")
    processes = [subprocess.Popen([sys.executable, os.path.join(case.root, "threads.py")], cwd=case.work,
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(count)]
    reports = []
    for process in processes:
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, f"exit {process.returncode}\n{err[-3000:]}"
        reports.append((json.loads(out.strip().splitlines()[-1]), err))
    return reports


def test_threads_and_processes_meeting_new_shapes_leave_a_sound_cache(scratch):
    """Issue 16's threads case, with 8 threads, in 2 processes sharing one empty cache at
    once: every answer right, nothing eager, no tracing state left behind. Then every file
    in the cache matches its record, no temporary file is left, and a third process loads
    the graphs with nothing to repair."""
    case = Case(os.path.join(scratch, f"case-{next(_counter)}"))
    for report, err in _run_together(case, 2, THREADS_RUNNER):
        assert report["problems"] == [] and report["eager_graphs"] == 0, (report, err[-3000:])
        assert report["fx_tracing"] is False and report["cache_repairs"] == 0, (report, err[-3000:])
    for folder, _, files in os.walk(case.cache):
        for name in files:
            path = os.path.join(folder, name)
            assert not name.startswith(cache_store.TEMP_PREFIXES), f"left behind: {path}"
            if name == cache_store.LOCK_NAME or "/kernels/" in path:
                continue
            if name.endswith(cache_store.RECORD_SUFFIX):
                path = path[:-len(cache_store.RECORD_SUFFIX)]
            assert cache_store.check(path)[1] is None, (path, cache_store.check(path)[1])
    ((report, err),) = _run_together(case, 1, THREADS_RUNNER)
    assert report["problems"] == [] and report["eager_graphs"] == 0 and report["cache_repairs"] == 0, err[-3000:]
    assert report["graph_cache_hits"] >= 3, report      # both functions and the recompile


# --- settings ---------------------------------------------------------------------------------

BAD_VALUES = {   # one bad value for every environment variable tritonfuse reads
    "TRITONFUSE_CPU_BACKEND": "gpu-please",
    "TRITONFUSE_AUTOTUNE": "fastest",
    "TRITONFUSE_MAX_AUTOTUNE": "max-autotune",
    "TRITONFUSE_GEMM_BACKENDS": "cublas,triton",
    "TRITONFUSE_GEMM_PROLOGUE": "1",
    "TRITONFUSE_PARTITIONER": "rematerialize-all",
    "TRITONFUSE_COMPILE_WORKERS": "many",
    "TRITONFUSE_COMPILE_POOL": "gpu",
    "TRITONFUSE_AUTOTUNE_INTERPRET": "sometimes",
    "TRITONFUSE_DEBUG": "verbose",
    "TRITONFUSE_CACHE_DIR": "~no-such-user-tritonfuse/cache",
    "TRITONFUSE_GRAPH_CACHE": "2",
    "TRITONFUSE_DIRECT_INFERENCE": "yes please",
    "TRITONFUSE_CUDAGRAPHS": "reduce-overhead",
    "TRITONFUSE_MERGE_LINEARS": "qkv",
    "TRITONFUSE_CAT_SLICES": "sometimes",
    "TRITONFUSE_LAYOUT_OPT": "channels_last",
    "TRITONFUSE_MAX_SHAPE_SPECIALIZATIONS": "banana",
    "TRITONFUSE_AUTOTUNE_CACHE_DIR": "~no-such-user-tritonfuse/autotune",
    "CXX": "/nonexistent/g++",
    "TRITONFUSE_CXXFLAGS": "-DX='unbalanced",
    "XDG_CACHE_HOME": "relative/cache",
}


def test_every_setting_has_a_bad_value_here():
    assert set(BAD_VALUES) == {knob.env for knob in config.KNOBS.values()} | {"XDG_CACHE_HOME"}


def test_every_setting_is_in_the_readme_table():
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    for name, knob in config.KNOBS.items():
        assert f"| `{name}` | `{knob.env}` |" in readme, name
    assert "| — | `XDG_CACHE_HOME` |" in readme


@pytest.mark.parametrize("env", list(BAD_VALUES))
def test_bad_setting_warns_once_and_uses_the_default(env):
    defaults, none = config.from_environment({})
    assert none == []
    values, problems = config.from_environment({env: BAD_VALUES[env]})
    assert values == defaults
    assert len(problems) == 1
    assert env in problems[0] and repr(BAD_VALUES[env]) in problems[0] and "allowed:" in problems[0]
    assert "using the default" in problems[0]


@pytest.mark.parametrize("env", list(BAD_VALUES))
def test_empty_setting_means_unset(env):
    assert config.from_environment({env: ""}) == config.from_environment({})
    assert config.from_environment({env: "  "}) == config.from_environment({})


def test_settings_parse_their_good_values(tmp_path):
    values, problems = config.from_environment({
        "TRITONFUSE_CPU_BACKEND": "Triton", "TRITONFUSE_AUTOTUNE": "max", "TRITONFUSE_DEBUG": "true",
        "TRITONFUSE_GRAPH_CACHE": "off", "TRITONFUSE_MAX_SHAPE_SPECIALIZATIONS": " 3 ",
        "TRITONFUSE_COMPILE_WORKERS": "0", "TRITONFUSE_COMPILE_POOL": "Threads",
        "TRITONFUSE_CACHE_DIR": str(tmp_path), "TRITONFUSE_CXXFLAGS": "-DA=1 '-DB=2 3'",
        "TRITONFUSE_MAX_AUTOTUNE": "on", "TRITONFUSE_GEMM_BACKENDS": " Triton, aten,",
        "TRITONFUSE_GEMM_PROLOGUE": " Cheap", "TRITONFUSE_PARTITIONER": " Default ",
        "XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert problems == []
    assert values["max_autotune"] is True and values["gemm_backends"] == "aten,triton"
    assert values["gemm_prologue_fusion"] == "cheap"
    assert values["partitioner"] == "default"
    assert values["cpu_backend"] == "triton" and values["autotune"] == "max" and values["debug"] is True
    assert values["graph_cache"] is False and values["max_shape_specializations"] == 3
    assert values["compile_workers"] == 0 and values["compile_pool"] == "threads"
    assert config.from_environment({})[0]["compile_workers"] is None     # unset: one per core but one
    assert values["cache_dir"] == str(tmp_path) and values["cxxflags"] == ("-DA=1", "-DB=2 3")
    assert values["autotune_cache_dir"] == str(tmp_path / "xdg" / "tritonfuse" / "autotune")


@pytest.mark.parametrize("env", ["TRITONFUSE_CACHE_DIR", "TRITONFUSE_AUTOTUNE_CACHE_DIR", "XDG_CACHE_HOME"])
def test_folder_settings_ignore_surrounding_whitespace(tmp_path, env):
    """As every other knob does: " /data/c\n" names /data/c, not a folder " " under the
    working directory (nor a bad XDG_CACHE_HOME)."""
    values, problems = config.from_environment({env: f" \t{tmp_path}\n"})
    assert problems == []
    assert values == config.from_environment({env: str(tmp_path)})[0]


@pytest.mark.parametrize("name,value", [("cpu_backend", "gpu-please"), ("autotune", "fastest"),
                                        ("debug", "yes"), ("max_shape_specializations", -1),
                                        ("max_shape_specializations", "8"), ("cache_dir", ""),
                                        ("compile_workers", -1), ("compile_pool", "gpu"),
                                        ("cxx", "/nonexistent/g++"), ("graph_cache", 2),
                                        ("gemm_backends", "cublas"), ("gemm_backends", ","),
                                        ("max_autotune", "yes")])
def test_bad_assignment_raises_at_the_assignment(name, value):
    before = getattr(config, name)
    with pytest.raises(ValueError, match=f"tritonfuse.config.{name} = .* is not valid .allowed: "):
        setattr(config, name, value)
    assert getattr(config, name) == before


def test_bad_settings_in_a_real_process(scratch):
    """Every variable bad at once: one warning line each, the default used, the function
    right and compiled; the empty cache folder means the default one, not the working folder."""
    case = Case(os.path.join(scratch, f"case-{next(_counter)}"))
    env = dict(BAD_VALUES, TRITONFUSE_CACHE_DIR="", TRITONFUSE_AUTOTUNE_CACHE_DIR="")
    report = case.run("cpp", **env)
    assert report["problems"] == [] and report["eager_graphs"] == 0
    warned = [line for line in case.stderr.splitlines() if "SettingWarning" in line]
    for name in set(BAD_VALUES) - {"TRITONFUSE_CACHE_DIR", "TRITONFUSE_AUTOTUNE_CACHE_DIR"}:
        assert len([line for line in warned if f" {name}=" in line]) == 1, (name, case.stderr)
    assert "Traceback" not in case.stderr
    assert os.listdir(case.work) == []            # nothing written into the working folder
    assert os.path.isdir(os.path.join(case.home, ".cache", "tritonfuse", "graphs"))


# --- the autotune cache CLI on an unusable location -------------------------------------------

CLI_COMMANDS = [["list"], ["show", "abc"], ["clear"], ["export", "bundle.json"], ["import", "bundle.json"]]


def _cli(capsys, *argv):
    status = cli_main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return status, out, err.splitlines()


@pytest.mark.parametrize("command", CLI_COMMANDS, ids=[c[0] for c in CLI_COMMANDS])
def test_cli_on_a_plain_file(tmp_path, capsys, monkeypatch, command):
    location = tmp_path / "cache"
    location.write_text("a plain file")
    from autotune_cache import AutotuneCache
    from test_autotune_cache import entry_for
    AutotuneCache(tmp_path / "source").put(*entry_for())
    AutotuneCache(tmp_path / "source").export(tmp_path / "bundle.json")
    monkeypatch.chdir(tmp_path)
    status, _, err = _cli(capsys, "--dir", str(location), *command)
    assert status == 1 and len(err) == 1 and "is a file, not a folder" in err[0], err
    status, _, err = _cli(capsys, "--dir", str(location / "below"), *command)
    assert status == 1 and len(err) == 1 and "plain file stands where a folder should be" in err[0], err


def test_cli_bad_arguments_and_missing_files(tmp_path, capsys):
    for argv, status_wanted in ([["frobnicate"], 2], [[], 2], [["show"], 2],
                                [["--dir", str(tmp_path), "import", str(tmp_path / "none.json")], 1],
                                [["--dir", str(tmp_path), "export", "/proc/no/such/folder/b.json"], 1]):
        status, _, err = _cli(capsys, *argv)
        assert status == status_wanted and len(err) == 1 and err[0].startswith("python -m autotune_cache: error:"), err


def test_cli_on_a_damaged_record(tmp_path, capsys):
    from autotune_cache import AutotuneCache
    from test_autotune_cache import entry_for
    key, entry = entry_for()
    AutotuneCache(tmp_path).put(key, entry)
    cut_short(str(tmp_path / f"{key}.json"))
    status, out, err = _cli(capsys, "--dir", str(tmp_path), "list")
    assert status == 0 and "no entries" in out and len(err) == 1 and "warning" in err[0] and "damaged" in err[0]
    status, _, err = _cli(capsys, "--dir", str(tmp_path), "show", key[:8])
    assert status == 1 and len(err) == 2 and "error" in err[1]
    assert (tmp_path / f"{key}.json").exists()         # the CLI reports, it does not delete


def test_cli_on_an_unreadable_folder(tmp_path, capsys, scratch):
    location = os.path.join(scratch, f"unreadable-{next(_counter)}")
    os.makedirs(location)
    os.chmod(location, 0)
    try:
        if os.geteuid() != 0:
            status, _, err = _cli(capsys, "--dir", location, "list")
        else:
            if _NOBODY_PROBLEM is not None:
                pytest.skip(f"running as root, and {_NOBODY_PROBLEM}")
            done = subprocess.run(_as_nobody([sys.executable, "-m", "autotune_cache", "--dir", location, "list"]),
                                  env=dict(os.environ, PYTHONPATH=REPO), cwd="/", capture_output=True,
                                  text=True, timeout=300)
            status, err = done.returncode, done.stderr.splitlines()
            assert "Traceback" not in done.stderr
    finally:
        os.chmod(location, 0o755)
    assert status == 1 and len(err) == 1 and "Permission denied" in err[0], err


def test_cli_as_a_command_when_its_folder_is_a_plain_file(tmp_path):
    """Issue 16's case: `python -m autotune_cache list` printed a NotADirectoryError traceback."""
    location = tmp_path / "cache"
    location.write_text("a plain file")
    done = subprocess.run([sys.executable, "-m", "autotune_cache", "list"], cwd=str(tmp_path),
                          env=dict(os.environ, PYTHONPATH=REPO, TRITONFUSE_AUTOTUNE_CACHE_DIR=str(location)),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and done.stderr.splitlines() == [
        f"python -m autotune_cache: error: the cache location {location} is a file, not a folder"]
