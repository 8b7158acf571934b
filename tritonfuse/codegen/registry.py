"""Device registry: which Scheduling class generates code for which device type.

    register_backend_for_device("cuda", TritonScheduling)     # done below
    register_backend_for_device("cpu", CppScheduling)         # done by cpu_backend

``config.cpu_backend == "triton"`` routes CPU tensors to the Triton backend run by
Triton's interpreter instead of the registered CPU backend.
"""
import importlib
import logging

from .. import config

log = logging.getLogger("tritonfuse")
_backends = {}


def register_backend_for_device(device_type: str, scheduling_cls) -> None:
    _backends[device_type] = scheduling_cls


def get_scheduling_class(device_type: str):
    if device_type == "cpu":
        if config.cpu_backend == "triton":
            from .triton.scheduling import InterpretedTritonScheduling
            return InterpretedTritonScheduling
        if "cpu" not in _backends:
            try:
                importlib.import_module("cpu_backend")
            except ImportError as error:
                log.warning("tritonfuse: cpu_backend unavailable (%s); using the Triton interpreter", error)
        if "cpu" not in _backends:
            from .triton.scheduling import InterpretedTritonScheduling
            return InterpretedTritonScheduling
    if device_type not in _backends:
        raise KeyError(f"no tritonfuse backend is registered for device type {device_type!r}")
    return _backends[device_type]


def _register_defaults():
    from .triton.scheduling import TritonScheduling
    register_backend_for_device("cuda", TritonScheduling)


_register_defaults()


def _backend_attribute(device_type: str, name: str, default):
    """A class attribute of the backend for ``device_type`` (``default`` if none is registered)."""
    try:
        cls = get_scheduling_class(device_type)
    except KeyError:
        return default
    return getattr(cls, name, default)


def prefers_materialized_reuse(device_type: str) -> bool:
    """Whether the backend for ``device_type`` would rather keep a costly value that
    several consumers read (in a local buffer) than recompute it for each."""
    return _backend_attribute(device_type, "materialize_expensive_reuse", False)


def two_pass_variance_max_row(device_type: str) -> int:
    """Rows up to this many elements get var/mean in two passes (mean, then squared
    deviations) rather than one Welford pass: cheaper when the row stays in cache."""
    return _backend_attribute(device_type, "two_pass_variance_max_row", 0)


def welford_for_strided_rows(device_type: str) -> bool:
    """Whether var/std over trailing dims read with a stride (a transposed input's rows)
    take one Welford pass even where two_pass_variance_max_row would give two."""
    return _backend_attribute(device_type, "welford_for_strided_rows", False)


def prefers_online_softmax(device_type: str) -> bool:
    """Whether sum(exp(x - amax(x))) should become one online "sumexp" reduction."""
    return _backend_attribute(device_type, "online_softmax", False)


def split_reduction_target(device) -> int:
    """How many programs the backend for ``device`` wants in flight: a reduction with
    fewer outputs than that is split in two (lowering/split_reduction.py). 0: never."""
    target = _backend_attribute(device.type, "split_reduction_target", None)
    return target(device) if target is not None else 0


def scatter_dtypes(device_type: str, mode: str) -> set:
    """The dtypes the backend for ``device_type`` can combine into an element indirectly
    with ``mode`` (an ops_table.SCATTER_MODES entry other than None)."""
    return set(_backend_attribute(device_type, "scatter_dtypes", {}).get(mode, ()))


def deterministic_scatter(device_type: str) -> bool:
    """Whether indirect float sums on this device come out the same on every run."""
    return _backend_attribute(device_type, "deterministic_scatter", False)


def matmul_choice(device_type: str):
    """The GEMM template of the backend for ``device_type`` and its choice against aten
    (``MatmulChoice``), or None: that backend's matmuls run as aten calls."""
    return _backend_attribute(device_type, "matmul_choice", None)
