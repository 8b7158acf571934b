"""Settings of the compiler, and the one place that reads tritonfuse's environment.

Each knob below is read from its environment variable once, when tritonfuse is imported;
tests and users may assign to it at run time (``tritonfuse.config.autotune = "max"``).
README.md lists every knob with its variable, allowed values and default.

Policy for bad values
    * An empty environment variable means unset.
    * A value outside a knob's allowed values gives ONE warning (``SettingWarning``) that
      names the variable, the value, the allowed values and the default used instead, and
      the process goes on with the default. Every knob changes how tritonfuse computes
      (which code generator, how much tuning, where files go), never what: each default
      gives the right answer, so a typo in a job template costs a warning, not a crashed
      training run or server. Who wants an error instead:
      ``warnings.simplefilter("error", tritonfuse.config.SettingWarning)``.
    * A bad value assigned in Python raises ValueError at the assignment.
"""
from __future__ import annotations

import os
import shlex
import shutil
import sys
import types
import warnings
from typing import Any, Callable, Mapping


class SettingWarning(UserWarning):
    """An environment variable of tritonfuse has a value it cannot use (the default is used)."""


# --- kinds of values ---------------------------------------------------------------------

class Choice:
    def __init__(self, *options: str):
        self.options = options
        self.allowed = ", ".join(options)

    def parse(self, text: str) -> str:
        return self.check(text.strip().lower())

    def check(self, value: Any) -> str:
        if value not in self.options:
            raise ValueError
        return value


class Flag:
    allowed = "1, 0 (or true/false, yes/no, on/off)"
    _words = {"1": True, "true": True, "yes": True, "on": True,
              "0": False, "false": False, "no": False, "off": False}

    def parse(self, text: str) -> bool:
        value = self._words.get(text.strip().lower())
        if value is None:
            raise ValueError
        return value

    def check(self, value: Any) -> bool:
        if value not in (True, False):   # also takes 0 and 1
            raise ValueError
        return bool(value)


class Count:
    """A whole number >= minimum; `optional`: None (the variable unset) is a value too."""

    def __init__(self, minimum: int, optional: bool = False):
        self.minimum = minimum
        self.optional = optional
        self.allowed = f"a whole number >= {minimum}"

    def parse(self, text: str) -> int:
        try:
            return self.check(int(text.strip()))
        except (TypeError, ValueError):
            raise ValueError from None

    def check(self, value: Any) -> int | None:
        if value is None and self.optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < self.minimum:
            raise ValueError
        return value


class Subset:
    """Comma-separated names out of a fixed set, at least one; kept as a string in the
    set's own order ("triton,aten" reads as "aten,triton")."""

    def __init__(self, *names: str):
        self.names = names
        self.allowed = f"one or more of {', '.join(names)}, comma-separated"

    def parse(self, text: str) -> str:
        return self.check(text)

    def check(self, value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError
        chosen = {word.strip().lower() for word in value.split(",")} - {""}
        if not chosen or not chosen <= set(self.names):
            raise ValueError
        return ",".join(name for name in self.names if name in chosen)


class Folder:
    """A folder path; relative ones are taken from the working directory at import, so a
    later chdir does not move the cache. Whether it can be written is found out at use
    (tritonfuse.cache_store falls back to a private folder, with a warning; the autotune
    CLI says so), not here: a substitute folder chosen here would let `python -m
    autotune_cache clear` clear a folder the user did not name."""
    allowed = "a folder path (~ and ~user expand)"

    def __init__(self, absolute_only: bool = False):
        self.absolute_only = absolute_only
        if absolute_only:
            self.allowed = "an absolute folder path"

    def parse(self, text: str) -> str:
        # surrounding whitespace is a pasting slip, not part of the name: " /data/c" would
        # otherwise be a folder named " " under the working directory
        path = os.path.expanduser(text.strip())
        if path.startswith("~"):     # ~someone who does not exist
            raise ValueError
        return self.check(path)

    def check(self, value: Any) -> str:
        if not isinstance(value, (str, os.PathLike)):
            raise ValueError
        path = os.fspath(value)
        if not path or "\0" in path or (self.absolute_only and not os.path.isabs(path)):
            raise ValueError
        return os.path.abspath(path)


class Command:
    """A command line whose first word is an executable (on PATH or a path): $CXX."""
    allowed = "a command whose first word is an executable on PATH or a path to one"

    def parse(self, text: str) -> str | None:
        return self.check(text.strip())

    def check(self, value: Any) -> str | None:
        if value is None:
            return None
        try:
            argv = shlex.split(value)
        except (AttributeError, ValueError):
            raise ValueError from None
        if not argv or shutil.which(argv[0]) is None:
            raise ValueError
        return value


class Words:
    """Extra command-line words, split like a shell does: $TRITONFUSE_CXXFLAGS."""
    allowed = "words split like a shell does (balanced quotes)"

    def parse(self, text: str) -> tuple[str, ...]:
        try:
            return tuple(shlex.split(text))
        except ValueError:
            raise ValueError from None

    def check(self, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            return self.parse(value)
        if not all(isinstance(word, str) for word in value):
            raise ValueError
        return tuple(value)


class Knob:
    def __init__(self, env: str, kind, default: Any | Callable[[Mapping[str, str]], Any],
                 meaning: str, default_text: str | None = None):
        self.env, self.kind, self._default, self.meaning = env, kind, default, meaning
        self.default_text = default_text   # how messages name the default, if not repr()

    def default(self, environ: Mapping[str, str]) -> Any:
        return self._default(environ) if callable(self._default) else self._default


def _cache_home(environ: Mapping[str, str]) -> str:
    """$XDG_CACHE_HOME (an absolute path, per the XDG spec), else ~/.cache."""
    fallback = os.path.expanduser("~/.cache")
    value, _ = _read(_XDG, environ, fallback)
    return value


_XDG = Knob("XDG_CACHE_HOME", Folder(absolute_only=True), None,
            "where per-user caches live (the default of the two cache folders)")

# name -> knob; README.md's knob table lists the same, in this order.
KNOBS: dict[str, Knob] = {
    "cpu_backend": Knob(
        "TRITONFUSE_CPU_BACKEND", Choice("cpp", "triton"), "cpp",
        "which code generator serves CPU tensors: OpenMP C++ (cpu_backend) or Triton kernels "
        "run by Triton's interpreter"),
    "autotune": Knob(
        "TRITONFUSE_AUTOTUNE", Choice("none", "default", "max"), "default",
        "candidate Triton launch configs tried at a kernel's first run: the heuristic's "
        "config only, a few for kernels of 64k elements or more (raced in short rounds), or "
        "the full search (for scripts/warmup_autotune.py)"),
    "compile_workers": Knob(
        "TRITONFUSE_COMPILE_WORKERS", Count(0, optional=True), None,
        "Triton compiles at once in the background (runtime/async_compile.py); 0: each in "
        "the thread that needs it", default_text="one per CPU core but one"),
    "compile_pool": Knob(
        "TRITONFUSE_COMPILE_POOL", Choice("auto", "threads", "processes"), "auto",
        "where background compiles run: auto is worker processes from 8 CPU cores on (threads "
        "stop scaling at 3-4, held by the GIL), else threads"),
    "max_autotune": Knob(
        "TRITONFUSE_MAX_AUTOTUNE", Flag(), False,
        "every compile as under torch.compile(mode=\"max-autotune\"): each matmul (mm, addmm, "
        "bmm) on a GPU benchmarks the Triton GEMM template, with its pointwise consumers fused "
        "into the store, against the aten call at compile time and keeps the faster "
        "(also per compile: options={\"max_autotune\": True})"),
    "gemm_backends": Knob(
        "TRITONFUSE_GEMM_BACKENDS", Subset("aten", "triton"), "aten,triton",
        "what a matmul's max-autotune choice may pick: the aten call and/or the GEMM template "
        "(triton alone: the template wherever it applies)"),
    "gemm_prologue_fusion": Knob(
        "TRITONFUSE_GEMM_PROLOGUE", Choice("off", "cheap", "all"), "off",
        "max-autotune: a pointwise producer of a matmul operand that only the matmul reads (a "
        "cast, a scale) computed in the GEMM template's operand load instead of a kernel of its "
        "own: never, casts and cheap arithmetic only, or any (prologue_fusion.py)"),
    "autotune_under_interpreter": Knob(
        "TRITONFUSE_AUTOTUNE_INTERPRET", Flag(), False,
        "tune even under Triton's interpreter (interpreted timings mean little)"),
    "debug": Knob(
        "TRITONFUSE_DEBUG", Flag(), False,
        "write each compiled graph's wrapper and kernels to a folder and print its path"),
    "cache_dir": Knob(
        "TRITONFUSE_CACHE_DIR", Folder(),
        lambda environ: os.path.join(_cache_home(environ), "tritonfuse"),
        "compiled graphs, C++ builds, Triton kernel files"),
    "graph_cache": Knob(
        "TRITONFUSE_GRAPH_CACHE", Flag(), True,
        "reuse compiled graphs, and aot_autograd's result for them, from the on-disk cache"),
    "direct_inference": Knob(
        "TRITONFUSE_DIRECT_INFERENCE", Flag(), True,
        "call an inference graph that needs none of aot_autograd's runtime-wrapper work (no "
        "input mutation, no aliased output, no autocast) directly"),
    "partitioner": Knob(
        "TRITONFUSE_PARTITIONER", Choice("min_cut", "default"), "min_cut",
        "how aot_autograd splits a training graph into forward and backward: min_cut saves "
        "what is cheapest to keep and recomputes cheap pointwise work in the backward's "
        "kernels; default saves every value the backward reads"),
    "merge_linears": Knob(
        "TRITONFUSE_MERGE_LINEARS", Choice("train", "all", "off"), "train",
        "linear layers on the same input (attention's q/k/v, a gated MLP's gate/up) become one "
        "matmul on concatenated weights (merge_linears.py): in graphs that need gradients, in "
        "every graph, or never"),
    "cat_slices": Knob(
        "TRITONFUSE_CAT_SLICES", Flag(), True,
        "a cat of costly inputs that only a matmul, a fallback or the output reads is computed "
        "input by input into slices of its memory (ir.ConcatSlice), not as one kernel that "
        "evaluates every input at every element"),
    "layout_opt": Knob(
        "TRITONFUSE_LAYOUT_OPT", Choice("auto", "1", "0"), "auto",
        "channels_last feature maps in graphs with 2-D convolutions (layout_opt.py): auto "
        "decides per graph (Inductor's heuristics on GPUs, a measured default on the CPU); "
        "1 and 0 force it on and off"),
    "cudagraphs": Knob(
        "TRITONFUSE_CUDAGRAPHS", Flag(), False,
        "replay compiled graphs from CUDA graphs, as torch.compile(mode=\"reduce-overhead\") "
        "or options={\"cudagraphs\": True} ask (runtime/cudagraphs.py)"),
    "max_shape_specializations": Knob(
        "TRITONFUSE_MAX_SHAPE_SPECIALIZATIONS", Count(0), 8,
        "per-shape compiles of a graph that cannot be compiled symbolically; further shapes run eagerly"),
    "autotune_cache_dir": Knob(
        "TRITONFUSE_AUTOTUNE_CACHE_DIR", Folder(),
        lambda environ: os.path.join(_cache_home(environ), "tritonfuse", "autotune"),
        "best Triton launch configs (`python -m autotune_cache list`)"),
    "cxx": Knob(
        "CXX", Command(), None,
        "the C++ compiler of the CPU backend; unset: g++, else clang++, from PATH",
        default_text="g++, else clang++, from PATH"),
    "cxxflags": Knob(
        "TRITONFUSE_CXXFLAGS", Words(), (),
        "extra flags for C++ kernel builds (flags the compiler rejects are dropped, with a "
        "warning)", default_text="none"),
}


def _read(knob: Knob, environ: Mapping[str, str], default: Any) -> tuple[Any, str | None]:
    """(value, warning or None) for one knob from `environ`; empty means unset."""
    text = environ.get(knob.env, "")
    if text.strip() == "":
        return default, None
    try:
        return knob.kind.parse(text), None
    except ValueError:
        return default, (f"tritonfuse: {knob.env}={text!r} is not valid (allowed: "
                         f"{knob.kind.allowed}); using the default, {_describe(knob, default)}")


def _describe(knob: Knob, value: Any) -> str:
    if knob.default_text is not None:
        return knob.default_text
    if isinstance(value, bool):
        return "1" if value else "0"
    return repr(value)


def from_environment(environ: Mapping[str, str]) -> tuple[dict[str, Any], list[str]]:
    """Every knob's value in `environ`, and one warning per bad variable."""
    values, problems = {}, []
    for name, knob in KNOBS.items():
        values[name], problem = _read(knob, environ, knob.default(environ))
        problems.append(problem)
    xdg_problem = _read(_XDG, environ, os.path.expanduser("~/.cache"))[1]
    return values, [p for p in [xdg_problem] + problems if p]


class _ConfigModule(types.ModuleType):
    """This module's class: assigning a bad value to a knob raises at the assignment."""

    def __setattr__(self, name: str, value: Any) -> None:
        knob = KNOBS.get(name)
        if knob is not None:
            try:
                value = knob.kind.check(value)
            except ValueError:
                raise ValueError(f"tritonfuse.config.{name} = {value!r} is not valid (allowed: "
                                 f"{knob.kind.allowed})") from None
        super().__setattr__(name, value)


cpu_backend: str
autotune: str
max_autotune: bool
gemm_backends: str
gemm_prologue_fusion: str
compile_workers: int | None
compile_pool: str
autotune_under_interpreter: bool
debug: bool
cache_dir: str
graph_cache: bool
direct_inference: bool
layout_opt: str
cudagraphs: bool
max_shape_specializations: int
autotune_cache_dir: str
cxx: str | None
cxxflags: tuple[str, ...]



def _load_environment() -> None:
    values, problems = from_environment(os.environ)
    globals().update(values)
    for problem in problems:   # one line each, with no source line under it
        warnings.warn_explicit(problem, SettingWarning, "<environment>", 0, module=__name__)


_load_environment()
sys.modules[__name__].__class__ = _ConfigModule

# Fusion (no environment variables).
max_fusion_size: int = 64
# A pointwise value read by more users than this is realized instead of recomputed.
realize_reads_threshold: int = 4
# A pointwise body with more loads than this is realized when it is reused.
realize_loads_threshold: int = 8
