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
import tempfile

import torch

from . import config

FORMAT_VERSION = 1


def _versions():
    import triton
    return {"torch": torch.__version__, "triton": triton.__version__, "format": FORMAT_VERSION}


def _source_fingerprint():
    """Hash of tritonfuse's own code, so an upgrade never loads stale generated code."""
    root = os.path.dirname(os.path.abspath(__file__))
    digest = hashlib.sha256()
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            if name.endswith((".py", ".j2", ".h")):
                with open(os.path.join(folder, name), "rb") as handle:
                    digest.update(handle.read())
    return digest.hexdigest()


_fingerprint = None


def graph_key(gm: torch.fx.GraphModule, example_inputs, extra=()) -> str:
    global _fingerprint
    if _fingerprint is None:
        _fingerprint = _source_fingerprint()
    inputs = [(tuple(t.shape), tuple(t.stride()), str(t.dtype), str(t.device), t.storage_offset())
              if isinstance(t, torch.Tensor) else repr(t) for t in example_inputs]
    knobs = {"cpu_backend": config.cpu_backend, "autotune": config.autotune}
    payload = json.dumps([gm.code, inputs, knobs, _versions(), _fingerprint, list(extra)], sort_keys=True,
                         default=str)
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
