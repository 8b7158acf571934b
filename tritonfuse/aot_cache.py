"""Warm starts: aot_autograd's result for a Dynamo graph, kept on disk.

A compiled model's first call in a new process goes through Dynamo, then aot_autograd
(functionalize, trace the joint graph, decompose, partition forward from backward), then
tritonfuse, whose generated code already comes from its graph cache (code_cache.py). The
aot_autograd step alone takes seconds on a transformer (Llama training on an H200: 2.5 s of
a 5.3 s warm first call) and gives the same graphs every time for the same Dynamo graph
and inputs. Inductor keeps that result in torch's AOTAutogradCache, which stores only
Inductor's own output; tritonfuse keeps its own:

* on a miss, aot_autograd runs as usual while ``Capture`` records what it hands its own
  (unused) cache functions, ``_cache_autograd_info`` and ``_cache_inference_info``: the
  runtime metadata and wrappers that rebuild the callable. tritonfuse's compilers add the
  graph-cache key and the aten graph of the forward, backward or inference graph. An
  inference entry is written at once, a training entry once its backward is compiled (at
  the first backward, as aot_autograd compiles it lazily);
* on a hit, torch's own hit path (``GenericAOTAutogradResult.wrap_post_compile``)
  rebuilds the runtime wrappers around the graphs loaded from the graph cache.

The key is stricter than torch's: the Dynamo graph's code, every input's metadata and which
inputs share storage, grad and autocast modes, the flags that decide how ops trace (SDPA,
TF32, cuDNN, deterministic), tritonfuse's settings, options and code, and the versions of
torch and triton. Kept conservative: graphs with symbolic sizes, Dynamo graphs that hold
parameters, buffers or constants (get_attr; the constants that aot_autograd's trace makes,
``torch.tensor(...)`` in a model, are kept: the graph cache keys their contents and the
pickled aten graph holds them), subgraphs, tensor subclasses, ops that torch's own cache refuses
(``check_node_safe``), CUDA graphs, or a compile that fell back (per shape or eagerly) are
not kept. Anything that fails while keeping or loading an entry leaves the graph to the
normal compile (logged at debug); an entry that cannot be used is deleted (cache_store).
A graph loaded through an entry that fails on its first call is compiled again for that
call's inputs, and the entry deleted (compile_fx.load_compiled_graph).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import json
import logging
import os
import pickle
import threading

import torch

from . import cache_store, code_cache, config, metrics

log = logging.getLogger("tritonfuse")

FORMAT_VERSION = 1
_active = threading.local()   # the Capture of the compile running in this thread


class NotCacheable(Exception):
    """Why a graph's aot_autograd result is not kept."""


def entry_path(key: str) -> str:
    return os.path.join(config.cache_dir, "aot", key[:2], f"a{key}.pkl")


# --- the key ------------------------------------------------------------------------------

def key_for(gm: torch.fx.GraphModule, example_inputs, options) -> str | None:
    """The entry key of this Dynamo graph with these inputs and options, or None when its
    result is not kept (the reason logged at debug)."""
    if not config.graph_cache or not _install_capture_hooks():
        return None
    try:
        _check_cacheable(gm, example_inputs, options)
        devices = {t.device.type for t in example_inputs if isinstance(t, torch.Tensor)}
        payload = json.dumps([FORMAT_VERSION, code_cache.code_without_comments(gm),
                              _input_fingerprint(example_inputs), _global_state(devices),
                              # what the graph keys an entry names were made under: loading an
                              # entry written under other knobs (another CPU thread count) would
                              # load that state's kernels (one thread's in a two-thread process)
                              code_cache.codegen_knobs(example_inputs), dataclasses.asdict(options),
                              _settings(), code_cache._versions(), code_cache._code_fingerprints(devices)],
                             sort_keys=True, default=repr)
    except NotCacheable as why:
        log.debug("tritonfuse: aot_autograd's result not kept: %s", why)
        return None
    except Exception:  # noqa: BLE001 - never fail a compile over the cache
        log.debug("tritonfuse: no aot cache key", exc_info=True)
        return None
    return hashlib.sha256(payload.encode()).hexdigest()


def _check_cacheable(gm, example_inputs, options) -> None:
    from torch._functorch._aot_autograd.autograd_cache import check_node_safe
    from torch._subclasses.fake_tensor import FakeTensor
    if options.cudagraphs:
        raise NotCacheable("CUDA graphs")
    if next(gm.parameters(), None) is not None or next(gm.buffers(), None) is not None \
            or next(gm.children(), None) is not None:
        raise NotCacheable("the graph holds parameters, buffers or subgraphs")
    if hasattr(gm, "saved_tensors_hooks_pack_0"):
        raise NotCacheable("saved-tensor hooks")
    if _compiled_autograd_enabled():
        raise NotCacheable("compiled autograd")
    for value in example_inputs:
        if isinstance(value, torch.Tensor):
            if type(value) not in (torch.Tensor, torch.nn.Parameter, FakeTensor) or value.layout != torch.strided:
                raise NotCacheable(f"an input of type {type(value).__name__}, layout {value.layout}")
            if any(isinstance(s, torch.SymInt) for s in (*value.shape, *value.stride(), value.storage_offset())):
                raise NotCacheable("symbolic sizes")
        elif type(value) not in (int, float, bool):
            raise NotCacheable(f"an input of type {type(value).__name__}")
    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            raise NotCacheable(f"a {node.op} node")
        if any(name in node.meta for name in ("recompute", "ac_graph_id", "custom")):
            raise NotCacheable("activation-checkpoint or custom node metadata")
        try:
            check_node_safe(node)
        except Exception as error:  # torch's BypassAOTAutogradCache
            raise NotCacheable(str(error)) from None


def _compiled_autograd_enabled() -> bool:
    from torch._dynamo import compiled_autograd
    return bool(getattr(compiled_autograd, "compiled_autograd_enabled", False)
                or getattr(compiled_autograd, "in_compiled_autograd_region", False))


def _input_fingerprint(example_inputs) -> list:
    """Each input's metadata, and which storage it shares with which earlier input
    (aot_autograd de-duplicates inputs and rebuilds views of a shared base from that)."""
    from torch.multiprocessing.reductions import StorageWeakRef
    storages: dict = {}
    described = []
    for value in example_inputs:
        if not isinstance(value, torch.Tensor):
            described.append((type(value).__name__, repr(value)))
            continue
        storage = storages.setdefault(StorageWeakRef(value.untyped_storage()), len(storages))
        described.append((tuple(value.shape), tuple(value.stride()), value.storage_offset(), str(value.dtype),
                          str(value.device), value.requires_grad, value.is_leaf, value._is_view(),
                          value.is_inference(), value.is_conj(), value.is_neg(),
                          isinstance(value, torch.nn.Parameter), storage))
    return described


def _global_state(device_types) -> dict:
    """State outside the graph that changes what aot_autograd traces."""
    from torch._functorch import config as functorch_config
    state = {
        "grad": torch.is_grad_enabled(),
        "deterministic": (torch.are_deterministic_algorithms_enabled(),
                          torch.is_deterministic_algorithms_warn_only_enabled()),
        "default_dtype": str(torch.get_default_dtype()),
        "functorch": hashlib.sha256(functorch_config.save_config()).hexdigest(),
        "matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn": (torch.backends.cudnn.enabled, torch.backends.cudnn.deterministic,
                  torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32),
        "opt_einsum": (torch.backends.opt_einsum.enabled, torch.backends.opt_einsum.strategy),
        "autocast": {device: (torch.is_autocast_enabled(device), str(torch.get_autocast_dtype(device)))
                     for device in sorted(device_types | {"cpu"})},
    }
    if "cuda" in device_types:
        matmul = torch.backends.cuda.matmul
        state["cuda_matmul"] = (matmul.allow_tf32, matmul.allow_fp16_reduced_precision_reduction,
                                matmul.allow_bf16_reduced_precision_reduction)
        state["sdpa"] = tuple(getattr(torch.backends.cuda, name)() for name in (
            "flash_sdp_enabled", "mem_efficient_sdp_enabled", "math_sdp_enabled", "cudnn_sdp_enabled"))
        state["gpus"] = sorted({(torch.cuda.get_device_name(i), torch.cuda.get_device_capability(i))
                                for i in range(torch.cuda.device_count())})
    return state


# settings that change no compile's result: where the caches live, debug dumps, how many
# workers compile
_SETTINGS_NOT_IN_KEY = {"cache_dir", "autotune_cache_dir", "debug", "compile_pool", "compile_workers"}


def _settings() -> dict:
    return {name: getattr(config, name) for name in sorted(set(config.KNOBS) - _SETTINGS_NOT_IN_KEY)
            if hasattr(config, name)}


# --- capture on a miss --------------------------------------------------------------------

@functools.lru_cache(None)
def _install_capture_hooks() -> bool:
    """Wrap aot_autograd's two cache functions (module globals it looks up at each call) so
    that the Capture of this thread's compile, if any, records their arguments. They pass
    through unchanged for every other caller. False on a torch without them."""
    try:
        from torch._functorch._aot_autograd import graph_compile
        from torch._functorch._aot_autograd.aot_autograd_result import GenericAOTAutogradResult  # noqa: F401
        originals = {kind: getattr(graph_compile, name)
                     for kind, name in (("autograd", "_cache_autograd_info"), ("inference", "_cache_inference_info"))}
    except (ImportError, AttributeError):
        log.debug("tritonfuse: this torch has no aot_autograd cache functions; no aot cache")
        return False
    for kind, original in originals.items():
        setattr(graph_compile, original.__name__, _recording(original, kind))
    return True


def _recording(original, kind: str):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def record_and_pass_through(*args, **kwargs):
        result = original(*args, **kwargs)
        capture = getattr(_active, "capture", None)
        if capture is not None:
            try:
                arguments = signature.bind(*args, **kwargs).arguments
            except TypeError as error:   # called otherwise than its signature says: keep nothing
                capture.spoil(f"{original.__name__}: {error}")
            else:
                capture.record_aot(kind, arguments)
        return result
    return record_and_pass_through


@contextlib.contextmanager
def capturing(capture: "Capture | None"):
    """While the block runs aot_autograd on a graph, record its result into ``capture``."""
    previous = getattr(_active, "capture", None)
    _active.capture = capture
    try:
        yield
    finally:
        _active.capture = previous


class Capture:
    """What one compile of a Dynamo graph needs kept to be rebuilt without aot_autograd."""

    def __init__(self, key: str):
        self.key = key
        self.kind = None          # "autograd" or "inference"
        self.runtime = None       # pickled runtime metadata, wrappers, saved-for-backward counts
        self.graphs = {}          # "forward" / "backward" / "inference": (graph key, pickled aten gm, options)
        self.spoiled = None       # why this compile's result is not kept

    def spoil(self, why: str) -> None:
        if self.spoiled is None:
            self.spoiled = why
            log.debug("tritonfuse: aot_autograd's result not kept: %s", why)

    def record_aot(self, kind: str, arguments: dict) -> None:
        try:
            self.kind = kind
            self.runtime = pickle.dumps(_runtime_fields(kind, arguments))
        except Exception as error:  # noqa: BLE001
            self.spoil(f"runtime metadata not kept ({type(error).__name__}: {error})")
            return
        self.save_if_complete()   # (an inference graph is compiled before this call)

    def record_graph(self, kind: str, gm: torch.fx.GraphModule, compiled) -> None:
        """A tritonfuse compiler's result for aot_autograd's ``kind`` graph."""
        key, options = getattr(compiled, "cache_key", None), getattr(compiled, "options", None)
        if key is None or options is None:
            self.spoil(f"the {kind} graph was not compiled into the graph cache")
            return
        try:
            self.graphs[kind] = (key, pickle.dumps(gm), options)
        except Exception as error:  # noqa: BLE001
            self.spoil(f"the {kind} aten graph does not pickle ({type(error).__name__}: {error})")
            return
        self.save_if_complete()

    def save_if_complete(self) -> None:
        needed = ("inference",) if self.kind == "inference" else ("forward", "backward")
        if self.spoiled or self.runtime is None or any(kind not in self.graphs for kind in needed):
            return
        entry = {"format": FORMAT_VERSION, "kind": self.kind, "runtime": self.runtime,
                 "graphs": {kind: self.graphs[kind] for kind in needed}}
        cache_store.write(entry_path(self.key), pickle.dumps(entry))
        self.spoiled = "saved"    # once


def _runtime_fields(kind: str, arguments: dict) -> dict:
    """The fields of torch's cache entry that are not compiled code, from the arguments of
    ``_cache_autograd_info`` or ``_cache_inference_info`` (after they made the metadata
    runtime-safe)."""
    from torch._functorch._aot_autograd.runtime_wrappers import BackwardState
    if arguments.get("maybe_subclass_meta") is not None:
        raise NotCacheable("tensor subclasses")
    fields = {"runtime_metadata": arguments["fw_metadata"], "dispatch_wrappers": arguments["wrappers"],
              "aot_config": _cacheable_aot_config(arguments["aot_config"])}
    if kind == "autograd":
        if any(isinstance(value, BackwardState) for value in arguments["flat_args"]):
            raise NotCacheable("a BackwardState input")
        fields.update(num_fw_outs_saved_for_bw=arguments["num_fw_outs_saved_for_bw"],
                      indices_of_inps_to_detach=arguments["_indices_of_inps_to_detach"],
                      num_symints_saved_for_bw=arguments["num_symints_saved_for_bw"])
    return fields


def _cacheable_aot_config(aot_config):
    """aot_config without its compilers, partitioner and decompositions."""
    if hasattr(aot_config, "to_cacheable"):
        return aot_config.to_cacheable()
    names = {f.name for f in dataclasses.fields(aot_config)}
    cleared = {name: None for name in ("fw_compiler", "bw_compiler", "inference_compiler", "partition_fn",
                                       "cache_info") if name in names}
    if "decompositions" in names:
        cleared["decompositions"] = {}
    return dataclasses.replace(aot_config, **cleared)


# --- load on a hit ------------------------------------------------------------------------

def load(key: str, example_inputs, shortcut):
    """The callable for Dynamo rebuilt from the entry under ``key``, or None: absent, or not
    usable (then deleted, and the graph is compiled as usual)."""
    path = entry_path(key)
    data = cache_store.read(path)
    if data is None:
        return None
    try:
        entry = pickle.loads(data)
        if entry.get("format") != FORMAT_VERSION:
            raise ValueError(f"format {entry.get('format')!r}")
        compiled = _rebuild(entry, key, example_inputs, shortcut)
    except _GraphMissing as why:   # the normal compile writes the graph, and this entry, again
        log.debug("tritonfuse: aot cache entry %s not used: %s", path, why)
        return None
    except Exception as error:  # noqa: BLE001 - the normal compile writes a fresh entry
        log.debug("tritonfuse: aot cache entry %s not used", path, exc_info=True)
        cache_store.discard(path, f"could not be used ({type(error).__name__}: {error})")
        return None
    metrics.aot_cache_hits += 1
    return compiled


class _GraphMissing(LookupError):
    pass


class _LoadedGraph:
    """What torch's hit path asks of a compiled forward, backward or inference graph."""

    def __init__(self, compiled, num_symints_saved_for_bw=None):
        self.compiled = compiled
        self.num_symints_saved_for_bw_ = num_symints_saved_for_bw
        self.backward_state_indices = []
        self.is_backward = num_symints_saved_for_bw is not None

    def load(self, example_inputs):
        return self.compiled

    def post_compile(self, compiled, fx_config):
        if not self.is_backward:
            return compiled
        # aot_autograd hands Dynamo a backward wrapped in disable (backends/common.py)
        return torch._dynamo.disable(compiled, reason="do not trace generated backwards pass")

    def pre_save(self):
        pass


def _rebuild(entry: dict, entry_key: str, example_inputs, shortcut):
    from torch._dynamo.utils import counters
    from torch._functorch._aot_autograd.aot_autograd_result import GenericAOTAutogradResult
    from .compile_fx import load_compiled_graph
    runtime = pickle.loads(entry["runtime"])
    aten_graphs = {kind: pickle.loads(gm) for kind, (_, gm, _) in entry["graphs"].items()}
    def discard_entry():
        cache_store.discard(entry_path(entry_key), "one of its graphs failed on its first call")

    graphs = {kind: load_compiled_graph(key, aten_graphs[kind], f"{kind}_cached", options, discard_entry)
              for kind, (key, _, options) in entry["graphs"].items()}
    if any(graph is None for graph in graphs.values()):
        raise _GraphMissing("a graph of the entry is not in the graph cache (any more)")
    aot_config = runtime["aot_config"]
    with contextlib.suppress(Exception):   # a fresh id, as a new compile gets
        from torch._functorch.aot_autograd import AOT_COUNTER
        aot_config = dataclasses.replace(aot_config, aot_id=next(AOT_COUNTER))
    if entry["kind"] == "inference":
        fw, bw = _LoadedGraph(graphs["inference"]), None
    else:
        fw = _LoadedGraph(graphs["forward"])
        bw = _LoadedGraph(graphs["backward"], runtime["num_symints_saved_for_bw"])
    values = dict(compiled_fw=fw, compiled_bw=bw, aot_joint_graph_str=None, aot_forward_graph_str=None,
                  aot_backward_graph_str=None, min_cut_info_str=None,
                  runtime_metadata=runtime["runtime_metadata"], dispatch_wrappers=runtime["dispatch_wrappers"],
                  maybe_subclass_meta=None, num_fw_outs_saved_for_bw=runtime.get("num_fw_outs_saved_for_bw"),
                  indices_of_inps_to_detach=runtime.get("indices_of_inps_to_detach", []),
                  forward_time_taken_ns=0, backward_time_taken_ns=0, sanitized_aot_config=aot_config,
                  guards_expr=None, serialized_bw_module=None)
    fields = dataclasses.fields(GenericAOTAutogradResult)
    unknown = [f.name for f in fields if f.name not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if unknown:
        raise TypeError(f"this torch's cache entries have fields tritonfuse does not fill: {unknown}")
    result = GenericAOTAutogradResult(**{f.name: values[f.name] for f in fields if f.name in values})
    compiled_fn = result.wrap_post_compile(list(example_inputs), aot_config, {})
    counters["aot_autograd"]["total"] += 1
    counters["aot_autograd"]["ok"] += 1
    if entry["kind"] == "inference":
        direct = shortcut.decide_from_cache(graphs["inference"], aten_graphs["inference"],
                                            runtime["runtime_metadata"])
        if direct is not None:
            return direct

    def forward(*runtime_args):   # the calling convention of aot_module_simplified's result
        return compiled_fn(list(runtime_args))
    return torch._dynamo.disable(forward, reason="do not trace AOT-compiled graph")
