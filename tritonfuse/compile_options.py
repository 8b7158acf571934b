"""The options of one ``torch.compile`` call, fixed when Dynamo hands the graph over.

    torch.compile(model, backend="tritonfuse", mode="max-autotune")
    torch.compile(model, backend="tritonfuse", options={"max_autotune": True, "cudagraphs": False})
    TRITONFUSE_MAX_AUTOTUNE=1, TRITONFUSE_CUDAGRAPHS=1  (tritonfuse.config: the defaults of every compile)

The modes mean what they mean for torch.compile:

    mode                        max_autotune   cudagraphs
    None, "default"             config         config
    "reduce-overhead"           config         yes
    "max-autotune"              yes            yes
    "max-autotune-no-cudagraphs" yes           config

and ``options`` override the mode. ``max_autotune``: each matmul (mm, addmm, bmm) on a
device whose backend has a GEMM template benchmarks the template's configs against the
aten call at compile time and keeps the faster; pointwise consumers of a template's
output fuse into its store. ``cudagraphs``: compiled graphs are replayed from CUDA graphs
(runtime/cudagraphs.py). The forward and the backward graph of one call share its options
(the backward compiles later, lazily).

``donated_inputs`` is no torch.compile option: the backward graph's inputs that aot_autograd
donates (saved activations that alias no forward input or output and that it releases
before calling the backward, as it does for Inductor), which memory planning may write
over (codegen/memory_planning.py).
"""
import logging
from dataclasses import dataclass

from . import config

log = logging.getLogger("tritonfuse")

# mode -> the options it turns on (the rest come from tritonfuse.config)
MODES = {
    None: (),
    "default": (),
    "reduce-overhead": ("cudagraphs",),
    "max-autotune": ("max_autotune", "cudagraphs"),
    "max-autotune-no-cudagraphs": ("max_autotune",),
}
OPTIONS = ("max_autotune", "cudagraphs")
_warned = set()


@dataclass(frozen=True)
class CompileOptions:
    max_autotune: bool = False
    cudagraphs: bool = False
    donated_inputs: tuple = ()   # backward graphs: indices of the inputs aot_autograd donates

    @staticmethod
    def from_torch_compile(mode=None, options=None) -> "CompileOptions":
        """The options of ``torch.compile(..., mode=mode, options=options)`` (unset ones
        from ``tritonfuse.config``). Modes and options tritonfuse does not know are
        logged and ignored: they change how fast code runs, never what it computes."""
        options = dict(options or {})
        ignored = ([f"mode {mode!r}"] if mode not in MODES else []) + \
            [f"option {name!r}" for name in sorted(set(options) - set(OPTIONS))]
        for what in ignored:
            if what not in _warned:      # once per process: every graph of a model passes them
                _warned.add(what)
                log.warning("tritonfuse: ignoring torch.compile's %s", what)
        from_mode = MODES.get(mode, ())
        values = {name: bool(options[name]) if name in options else (name in from_mode or getattr(config, name))
                  for name in OPTIONS}
        return CompileOptions(**values)
