"""The options of one ``torch.compile`` call, fixed when Dynamo hands the graph over.

    torch.compile(model, backend="tritonfuse", mode="max-autotune")
    torch.compile(model, backend="tritonfuse", options={"max_autotune": True})
    TRITONFUSE_MAX_AUTOTUNE=1  (tritonfuse.config.max_autotune: the default of every compile)

``max_autotune``: each matmul (mm, addmm, bmm) on a device whose backend has a GEMM template
benchmarks the template's configs against the aten call at compile time and keeps the
faster; pointwise consumers of a template's output fuse into its store. The forward and
the backward graph of one call share its options (the backward compiles later, lazily).
"""
import logging
from dataclasses import dataclass

from . import config

log = logging.getLogger("tritonfuse")

MAX_AUTOTUNE_MODES = ("max-autotune", "max-autotune-no-cudagraphs")
KNOWN_MODES = (None, "default") + MAX_AUTOTUNE_MODES
KNOWN_OPTIONS = ("max_autotune",)
_warned = set()


@dataclass(frozen=True)
class CompileOptions:
    max_autotune: bool = False

    @staticmethod
    def from_torch_compile(mode=None, options=None) -> "CompileOptions":
        """The options of ``torch.compile(..., mode=mode, options=options)`` (unset ones
        from ``tritonfuse.config``). Modes and options tritonfuse does not know are
        logged and ignored: they change how fast code runs, never what it computes."""
        options = dict(options or {})
        ignored = ([f"mode {mode!r}"] if mode not in KNOWN_MODES else []) + \
            [f"option {name!r}" for name in sorted(set(options) - set(KNOWN_OPTIONS))]
        for what in ignored:
            if what not in _warned:      # once per process: every graph of a model passes them
                _warned.add(what)
                log.warning("tritonfuse: ignoring torch.compile's %s", what)
        max_autotune = config.max_autotune or mode in MAX_AUTOTUNE_MODES
        if "max_autotune" in options:
            max_autotune = bool(options["max_autotune"])
        return CompileOptions(max_autotune=max_autotune)
