"""On-disk cache of generated modules, keyed by a hash of what determines them.

``graph_key`` hashes the aten graph's code, the inputs' sizes/strides/dtypes/devices, the
knobs that change generated code, and the tritonfuse/torch/triton versions. A module
saved under that key is loaded by any later process without lowering, scheduling or
generating a kernel again.

An entry is ``graphs/<key[:2]>/g<key>.py`` (the wrapper module) and ``g<key>.json`` (what
it was made of: kernel names, fallbacks), both written and verified by cache_store; the
module is executed from the verified bytes, never read twice.
"""
import hashlib
import io
import json
import linecache
import operator
import os
import sys
import types

import torch

from . import cache_store, config
from .codegen.registry import get_scheduling_class, split_reduction_target

# 2: entries carry cache_store size/hash records
# 3: records name their file (cache_store "tritonfuse-sum 2")
FORMAT_VERSION = 3


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


def code_without_comments(gm: torch.fx.GraphModule) -> str:
    """The graph's code without its comments (the source lines each node came from, which
    a graph rebuilt without node metadata lacks, and which change nothing it computes)."""
    return "\n".join(line for line in gm.code.splitlines() if not line.lstrip().startswith("#"))


def codegen_knobs(example_inputs) -> dict:
    """Process state outside the graph that changes the code generated for it: part of the
    graph key, and of the aot cache's key (an entry names a graph key written under it)."""
    knobs = {"cpu_backend": config.cpu_backend, "autotune": config.autotune, "cat_slices": config.cat_slices}
    # C++ kernels are generated for the thread count of the moment (graphs with no CPU
    # input may still make CPU tensors); reductions are split for the device's size
    knobs["cpu_threads"] = torch.get_num_threads()
    # deterministic algorithms turn atomic float sums into fallbacks (lowering/indexing.py)
    knobs["deterministic"] = torch.are_deterministic_algorithms_enabled()
    knobs["split_targets"] = sorted({(str(t.device), split_reduction_target(t.device))
                                     for t in example_inputs if isinstance(t, torch.Tensor)})
    return knobs


def graph_key(gm: torch.fx.GraphModule, example_inputs, extra=()) -> str:
    inputs = [(tuple(t.shape), tuple(t.stride()), str(t.dtype), str(t.device), t.storage_offset())
              if isinstance(t, torch.Tensor) else repr(t) for t in example_inputs]
    devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
    knobs = codegen_knobs(example_inputs)
    payload = json.dumps([code_without_comments(gm), inputs, knobs, _versions(), _code_fingerprints(devices),
                          list(extra)],
                         sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


# The most bytes of constants a graph may hold and still be kept in the graph cache: each
# compile hashes them (about 5 ms per MiB), so a graph holding large frozen weights is
# compiled again instead.
MAX_HASHED_CONSTANT_BYTES = 64 << 20


def constants_fingerprint(gm: torch.fx.GraphModule) -> list | None:
    """What a graph's get_attr tensors add to its key: each one's target, metadata and a
    hash of its contents (the generated code reads them at run time, and a graph loaded
    from the cache takes them from the graph it stands for); [] for none. None where they
    are too large to hash at every compile (MAX_HASHED_CONSTANT_BYTES): not cacheable."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    fingerprint, total = [], 0
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        try:
            value = operator.attrgetter(node.target)(gm)
        except AttributeError:
            return None
        if not isinstance(value, torch.Tensor):
            fingerprint.append((node.target, repr(value)))
            continue
        if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.layout != torch.strided:
            return None
        total += value.numel() * value.element_size()
        if total > MAX_HASHED_CONSTANT_BYTES:
            return None
        data = io.BytesIO()
        with unset_fake_temporarily():
            torch.save(value.detach().to("cpu").contiguous().clone(), data)
        fingerprint.append((node.target, str(value.dtype), tuple(value.shape), tuple(value.stride()),
                            value.storage_offset(), str(value.device), hashlib.sha256(data.getvalue()).hexdigest()))
    return fingerprint


def module_path(key: str) -> str:
    return os.path.join(config.cache_dir, "graphs", key[:2], f"g{key}.py")


def _meta_path(module: str) -> str:
    return module[:-3] + ".json"


def write_entry(key: str, source: str, meta: dict) -> str:
    """Store a compiled graph; returns the module's path (a private twin if the cache
    cannot be written)."""
    path = cache_store.write(module_path(key), source)
    cache_store.write(_meta_path(path), json.dumps(meta, sort_keys=True))
    return path


def read_entry(key: str):
    """(source, meta, path) of the verified entry for `key`, or None (absent or damaged:
    a damaged part is deleted by cache_store and the graph is compiled again)."""
    path = module_path(key)
    source = cache_store.read(path)
    if source is None:
        return None
    meta_bytes = cache_store.read(_meta_path(path))
    if meta_bytes is None:
        return None
    try:
        meta = json.loads(meta_bytes)
        if not isinstance(meta, dict):
            raise ValueError(f"a {type(meta).__name__}, not an object")
        return source.decode("utf-8"), meta, path
    except ValueError as error:   # verified, yet not what this version writes
        discard_entry(key, f"unusable meta: {error}")
        return None


def discard_entry(key: str, why: str) -> None:
    """Delete the entry for `key` (it failed to load or to run)."""
    path = module_path(key)
    cache_store.discard(path, why)
    cache_store.discard(_meta_path(path), why)


def load_module(source: str, path: str, namespace=None):
    """Execute a generated module from `source`; `path` names it in tracebacks (linecache
    holds the source, so they show the code that ran even if the file changes)."""
    name = "tritonfuse_generated_" + os.path.splitext(os.path.basename(path))[0]
    module = types.ModuleType(name)
    module.__file__ = path
    if namespace:
        module.__dict__.update(namespace)
    linecache.cache[path] = (len(source), None, source.splitlines(True), path)
    exec(compile(source, path, "exec"), module.__dict__)
    return module
