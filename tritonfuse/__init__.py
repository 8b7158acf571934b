"""tritonfuse: a torch.compile backend that lowers aten graphs to a loop-level IR,
fuses them with one shared scheduler and generates Triton kernels (GPU) or OpenMP C++
(CPU). Use it as ``torch.compile(model, backend="tritonfuse")``."""
from . import config, metrics  # noqa: F401
from .codegen.registry import register_backend_for_device  # noqa: F401


def __getattr__(name):
    if name == "testing":
        from . import testing
        return testing
    raise AttributeError(name)


def _register():
    try:
        from .backend import _register_with_dynamo
        _register_with_dynamo()
    except Exception:  # dynamo unavailable: the entry point still registers the backend
        pass


_register()
