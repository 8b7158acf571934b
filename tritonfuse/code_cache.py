"""On-disk cache of generated modules, keyed by a hash of what determines them.

``graph_key`` hashes the aten graph's code, the inputs' sizes/strides/dtypes/devices, the
knobs that change generated code, and the tritonfuse/torch/triton versions. A module
saved under that key is loaded by any later process without lowering, scheduling or
generating a kernel again.
"""
import hashlib
import importlib.util
import json
import os
import sys
import tempfile

import torch

from . import config
from .codegen.registry import get_scheduling_class, split_reduction_target

FORMAT_VERSION = 1


def _versions():
    import triton
    return {"torch": torch.__version__, "triton": triton.__version__, "format": FORMAT_VERSION}


def _source_fingerprint(root: str) -> str:
    """Hash of a package's code, so an upgrade never loads stale generated code."""
    digest = hashlib.sha256()
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            if name.endswith((".py", ".j2", ".h")):
                with open(os.path.join(folder, name), "rb") as handle:
                    digest.update(handle.read())
    return digest.hexdigest()


_fingerprints: dict[str, str] = {}


def _code_fingerprints(device_types) -> list[str]:
    """Fingerprints of tritonfuse and of the package of each backend that will generate
    code for ``device_types`` (a backend registered from outside, like cpu_backend, too)."""
    roots = {os.path.dirname(os.path.abspath(__file__))}
    for device_type in sorted(device_types):
        try:
            module = sys.modules[get_scheduling_class(device_type).__module__]
        except KeyError:
            continue
        package = sys.modules.get(module.__name__.split(".")[0], module)
        roots.add(os.path.dirname(os.path.abspath(package.__file__)))
    for root in roots:
        if root not in _fingerprints:
            _fingerprints[root] = _source_fingerprint(root)
    return [_fingerprints[root] for root in sorted(roots)]


def graph_key(gm: torch.fx.GraphModule, example_inputs, extra=()) -> str:
    inputs = [(tuple(t.shape), tuple(t.stride()), str(t.dtype), str(t.device), t.storage_offset())
              if isinstance(t, torch.Tensor) else repr(t) for t in example_inputs]
    devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
    knobs = {"cpu_backend": config.cpu_backend, "autotune": config.autotune}
    # C++ kernels are generated for the thread count of the moment (graphs with no CPU
    # input may still make CPU tensors); reductions are split for the device's size
    knobs["cpu_threads"] = torch.get_num_threads()
    # deterministic algorithms turn atomic float sums into fallbacks (lowering/indexing.py)
    knobs["deterministic"] = torch.are_deterministic_algorithms_enabled()
    knobs["split_targets"] = sorted({(str(t.device), split_reduction_target(t.device))
                                     for t in example_inputs if isinstance(t, torch.Tensor)})
    payload = json.dumps([gm.code, inputs, knobs, _versions(), _code_fingerprints(devices), list(extra)],
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


def module_path(key: str) -> str:
    return os.path.join(config.cache_dir, "graphs", key[:2], f"g{key}.py")


def write_module(key: str, source: str) -> str:
    path = module_path(key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
    with os.fdopen(fd, "w") as handle:
        handle.write(source)
    os.replace(tmp, path)
    return path


def load_module(path: str, namespace=None):
    name = "tritonfuse_generated_" + os.path.basename(path)[:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    if namespace:
        module.__dict__.update(namespace)
    spec.loader.exec_module(module)
    return module
