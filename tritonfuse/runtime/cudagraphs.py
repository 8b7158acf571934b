"""CUDA graphs (``mode="reduce-overhead"``): a compiled graph captured once, then replayed.

Opt-in: ``torch.compile(m, backend="tritonfuse", mode="reduce-overhead")`` (or
``"max-autotune"``), or ``options={"cudagraphs": True}``, or ``TRITONFUSE_CUDAGRAPHS=1``
(compile_options.py). ``wrap`` puts each
compiled graph (inference, forward, backward) that can be captured behind a
``CudaGraphRunner``:

    call 1   runs the compiled graph as it is: the warm-up, which compiles and autotunes
             every kernel (nothing is tuned while capturing)
    call 2   captures it on static inputs into a memory pool of its own, then replays it
    later    replays: copies each input that may change into its static buffer (unless it
             already is that buffer); parameters, buffers, the tensors the forward saved
             for the backward and the inputs the graph writes into are read (and written)
             where they are and only checked not to have moved

Outputs live in the graph's pool, so the next replay of the same graph overwrites them.
That is torch's rule for ``reduce-overhead``, and it is checked here:

  * outputs the caller sees: their memory is handed out anew at each replay; one that is
    still referenced when the graph replays again is invalidated, and touching it raises
    ``OVERWRITTEN``. Outputs of at most ``COPIED_OUTPUT_BYTES`` (a loss, a token id) are
    returned as copies and never go stale.
  * tensors a forward saved for its backward: a forward called again before the backward
    of its last replay ran (and while that replay's autograd graph is alive) runs without
    the graph, into fresh memory. ``BackwardTracker`` links the forward and the backward.
  * gradients a backward returned: a backward called while they are still referenced
    (``param.grad`` kept for gradient accumulation) runs without the graph.

A graph that cannot be captured (CPU tensors, symbolic sizes, data-dependent ops, an op
that synchronizes, a failed capture) runs as compiled, the reason logged once and kept in
``tritonfuse.metrics.cudagraph_skips``. Calls that cannot replay (a parameter moved,
outputs still held as above, two threads at once) run as compiled too, logged once.
"""
import logging
import threading
import weakref

import torch

from .. import metrics

log = logging.getLogger("tritonfuse")

COPIED_OUTPUT_BYTES = 4096
OVERWRITTEN = ("tritonfuse: this tensor is an output of a CUDA graph (mode=\"reduce-overhead\") that a later call "
               "of the same compiled function overwrote. Use or clone() outputs before calling it again, or compile "
               "without CUDA graphs.")
# ops whose results or sizes depend on tensor values: they synchronize with the host
# (ops with data-dependent output sizes are found by their unbacked size symbols too)
DATA_DEPENDENT_OPS = {"_local_scalar_dense", "item", "nonzero", "masked_select", "_unique", "_unique2", "unique_dim",
                      "unique_consecutive", "equal", "is_nonzero", "allclose"}

USER, SAVED, GRAD = "user", "saved", "grad"


class BackwardTracker:
    """Shared by the forward and backward runners of one compiled function: whether the
    forward's last replay still awaits its backward, which reads what that replay saved
    in the forward graph's memory (``saved_storages``: their addresses; ``stable_storages``
    adds the parameters and buffers the forward saved: a backward reads all of them where
    they are)."""

    def __init__(self):
        self.pending = False
        self.saved_storages = set()
        self.stable_storages = set()

    def consumed_by(self, args) -> bool:
        """Whether a backward with these inputs reads the forward graph's saved tensors."""
        return self.pending and any(isinstance(arg, torch.Tensor) and arg.untyped_storage().data_ptr()
                                    in self.saved_storages for arg in args)


def wrap(compiled, gm, example_inputs, graph_id: str, kind: str, tracker: BackwardTracker = None):
    """``compiled`` behind a ``CudaGraphRunner``, or as it is (logged) when the graph
    cannot be captured. ``kind``: "inference", "forward" or "backward"; ``tracker`` links a
    forward with its backward."""
    reason = capture_blocker(gm, example_inputs)
    if reason is not None:
        _skip(graph_id, reason)
        return compiled
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    metadata = _forward_metadata() if kind != "backward" else None
    if kind == "backward":      # saved tensors: in place if they live in the forward's memory
        fixed = {i for i, node in enumerate(placeholders) if not node.name.startswith("tangents")}
    else:                       # parameters and buffers
        fixed = set(getattr(metadata, "static_input_indices", None) or ())
    # inputs the graph writes into (lowering/input_mutation.py): written where they are
    mutated = {i for i, node in enumerate(placeholders)
               if any(user.target is torch.ops.aten.copy_.default and user.args[0] is node for user in node.users)}
    user_outputs = None         # every output, for an inference graph
    if kind == "forward":       # (mutated inputs, outputs, ...) then the tensors saved for the backward
        known = metadata is not None and not getattr(metadata, "tokens", None)
        user_outputs = getattr(metadata, "num_forward", 0) if known else 0    # unknown: all saved (the safe side)
    return CudaGraphRunner(compiled, graph_id, kind, fixed, user_outputs, tracker, mutated)


def capture_blocker(gm, example_inputs):
    """Why a graph cannot be captured, or None."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    for value in example_inputs:
        if isinstance(value, (torch.SymInt, torch.SymFloat)) or (
                isinstance(value, torch.Tensor) and any(isinstance(s, torch.SymInt) for s in value.shape)):
            return "dynamic shapes"
    values = []
    for node in gm.graph.nodes:
        target = getattr(node.target, "__name__", str(node.target)).split(".")[0]
        if node.op == "call_function" and target in DATA_DEPENDENT_OPS:
            return f"data-dependent op {target}"
        value = node.meta.get("val")
        for item in (value if isinstance(value, (list, tuple)) else [value]):
            if isinstance(item, (torch.Tensor, torch.SymInt, torch.SymFloat)) and free_unbacked_symbols(item):
                return f"data-dependent sizes ({node.name})"
            values.append((node, item))
    devices = {item.device for _, item in values if isinstance(item, torch.Tensor)}
    for node, item in values:
        if isinstance(item, torch.Tensor) and item.device.type not in DRIVERS:
            return f"CPU tensors ({node.name} on {item.device})"
    if len(devices) > 1:
        return f"tensors on several devices ({', '.join(sorted(map(str, devices)))})"
    device_type = next(iter(devices)).type if devices else "cuda"
    return DRIVERS[device_type].why_unavailable()


def _skip(graph_id, reason):
    log.warning("tritonfuse: %s runs without a CUDA graph: %s", graph_id, reason)
    metrics.cudagraph_skips[graph_id] = reason


def _forward_metadata():
    context = torch._guards.TracingContext.try_get()
    return None if context is None else getattr(context, "fw_metadata", None)


class CudaGraphRunner:
    """A compiled graph replayed from a CUDA graph (boxed: takes the list of inputs)."""

    def __init__(self, compiled, graph_id, kind, fixed_inputs, user_outputs, tracker=None, mutated_inputs=()):
        self._boxed_call = True
        self.tracker = tracker
        self.compiled = compiled
        self.graph_id = graph_id
        self.kind = kind
        self.fixed = set(fixed_inputs)      # may be read where they are: parameters, buffers, saved tensors
        self.mutated = set(mutated_inputs)  # written by the graph: always used where they are
        self.user_outputs = user_outputs    # outputs [0, n) are the caller's; None: all of them
        self.calls = 0
        self.disabled = None                # why this graph never replays
        self.captured = None                # _Captured, after the second call
        self._lock = threading.Lock()
        self._logged = set()

    def __call__(self, args):
        tracker = self.tracker if self.kind == "backward" else None
        consuming = tracker is not None and tracker.consumed_by(args)
        try:
            return self._call(args, consuming)
        finally:
            if consuming:     # the forward's saved tensors are free to overwrite, unless retained
                tracker.pending = _retains_graph()

    def _call(self, args, consuming):
        captured = self.captured
        if captured is not None:
            return self._replay(captured, args)
        if self.kind == "backward" and self.tracker is not None and self.tracker.saved_storages and not consuming:
            return self.compiled(args)    # capture on a backward whose saved tensors stay where they are
        self.calls += 1
        if self.disabled is not None or self.calls == 1:
            return self.compiled(args)
        from ..compile_lock import compiling
        with compiling():        # one capture at a time, like compiles
            if self.captured is None and self.disabled is None:
                try:
                    self.captured = _Captured(self, args)
                except _CannotCapture as reason:
                    self._disable(str(reason))
                except Exception as error:    # noqa: BLE001 - the compiled graph still runs
                    self._disable(f"capture failed ({type(error).__name__}: {error})")
        if self.captured is None:
            return self.compiled(args)
        return self._replay(self.captured, args)

    def fixed_inputs(self, args):
        """The inputs the graph reads where they are, checked at each replay not to have
        moved: parameters and buffers; for a backward, the saved tensors that live in the
        forward graph's memory, and parameters. The others are copied in."""
        in_forward_memory = self.tracker.stable_storages if self.tracker is not None else set()
        fixed = []
        for i, arg in enumerate(args):
            if not isinstance(arg, torch.Tensor):
                continue
            if isinstance(arg, torch.nn.Parameter) or i in self.mutated or (i in self.fixed and (
                    self.kind != "backward" or arg.untyped_storage().data_ptr() in in_forward_memory)):
                fixed.append(i)
        return fixed

    def role(self, index: int) -> str:
        if self.kind == "backward":
            return GRAD
        if self.user_outputs is None or index < self.user_outputs:
            return USER
        return SAVED

    def _disable(self, reason):
        self.disabled = reason
        self.captured = None
        _skip(self.graph_id, reason)

    def _uncaptured(self, args, reason):
        if reason not in self._logged:
            self._logged.add(reason)
            log.info("tritonfuse: a call of %s runs without its CUDA graph: %s", self.graph_id, reason)
        metrics.cudagraph_uncaptured_calls += 1
        return self.compiled(args)

    def _replay(self, captured, args):
        reason = captured.blocker(args)
        if reason is not None:
            return self._uncaptured(args, reason)
        if not self._lock.acquire(blocking=False):
            return self._uncaptured(args, "called from two threads at once")
        try:
            return captured.replay(args)
        finally:
            self._lock.release()


class _CannotCapture(Exception):
    pass


class CudaDriver:
    """The device side of capture and replay. Tests put an emulation of it in ``DRIVERS``
    to run the bookkeeping on CPU tensors (tests/cudagraph_emulation.py)."""

    def why_unavailable(self):
        if not torch.cuda.is_available():
            return "no CUDA device"
        missing = [name for name in ("_construct_storage_from_data_pointer", "_storage_Use_Count")
                   if not hasattr(torch._C, name)]
        return f"this torch lacks {', '.join(missing)}" if missing else None

    def capture(self, run, static_inputs, device):
        """(graph, static outputs) of ``run(static_inputs)`` captured on the device's capture
        stream, after one more warm-up run there (per-stream lazy set-up, e.g. cuBLAS).

        cuBLAS keeps a workspace per stream (32 MiB on an H100), allocated at its first
        matmul there. Every capture shares one stream per device, and the workspaces are
        dropped before and after capturing, as Inductor does: the capture allocates the one
        it uses in the graph's own pool, and the warm-up's does not stay allocated beside
        it (a stream per capture kept 32 MiB more allocated per captured graph)."""
        with _CAPTURE_LOCK, torch.cuda.device(device):
            stream = _capture_stream(device)
            current = torch.cuda.current_stream(device)
            stream.wait_stream(current)
            with torch.cuda.stream(stream):
                run(list(static_inputs))
            graph = torch.cuda.CUDAGraph()
            _clear_cublas_workspaces()
            try:
                with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                    outputs = run(list(static_inputs))
            finally:
                _clear_cublas_workspaces()
            current.wait_stream(stream)
        return graph, list(outputs)

    def replay(self, graph):
        graph.replay()

    def current_stream(self, device):
        return torch.cuda.current_stream(device)

    def current_raw_stream(self, device):
        """The current stream's handle (cheaper than its stream object)."""
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        return raw(device.index) if raw is not None else torch.cuda.current_stream(device).cuda_stream

    def invalidate(self, storage_cdata) -> bool:
        """Make the storage raise OVERWRITTEN when touched; False if this torch cannot."""
        poison = getattr(torch._C, "_set_storage_data_ptr_access_error_msg", None)
        if poison is None:
            return False
        poison(storage_cdata, OVERWRITTEN)
        return True

    def tensor_on(self, storage, meta):
        construct = getattr(torch._C, "_construct_CUDA_Tensor_From_Storage_And_Metadata", None)
        if construct is not None:
            return construct(meta, storage)
        return _tensor_on(storage, meta)

    can_invalidate = hasattr(torch._C, "_set_storage_data_ptr_access_error_msg")


DRIVERS = {"cuda": CudaDriver()}


class _Captured:
    """One capture of a runner's graph: its static inputs and outputs and their bookkeeping."""

    def __init__(self, runner: CudaGraphRunner, args):
        # no reference to the runner: a capture may outlive it (see _retire)
        self.kind, self.tracker = runner.kind, runner.tracker
        self.device = _device_of(args)
        self.driver = DRIVERS[self.device.type]
        for i, arg in enumerate(args):
            if isinstance(arg, torch.Tensor) and arg.device != self.device:
                raise _CannotCapture(f"input {i} is on {arg.device}")
        self.fixed = runner.fixed_inputs(args)
        fixed = set(self.fixed)
        self.fixed_ptrs = [args[i].data_ptr() if i in fixed else None for i in range(len(args))]
        self.copied = [i for i, arg in enumerate(args) if isinstance(arg, torch.Tensor) and i not in fixed]
        self.static_inputs = list(args)
        for i in self.copied:
            self.static_inputs[i] = _static_buffer(args[i])
        self.copy_targets = [_writable(self.static_inputs[i]) for i in self.copied]
        # inputs captured expanded (stride 0): only one element along those dims is copied in
        self.expanded = [i for i in self.copied if _expanded_dims(self.static_inputs[i])]
        for i, target in zip(self.copied, self.copy_targets):
            target.copy_(_writable_source(args[i], target))
        # capturing runs the graph once more (its warm-up): the inputs it writes into get
        # their values back, for the replay that follows to write them once
        old_values = [(args[i], args[i].clone()) for i in sorted(runner.mutated)]
        self.graph, outputs = self.driver.capture(runner.compiled, self.static_inputs, self.device)
        for tensor, old in old_values:
            tensor.copy_(old)
        self._plan_outputs(outputs, args, runner.role)
        self.thread = None
        self.stream = None                  # the stream of the last replay: (raw handle, stream)
        self.handed_out = []                # StorageWeakRefs of the caller's outputs of the last replay
        metrics.add("cudagraph_captures")
        weakref.finalize(runner, _retire, self)
        log.info("tritonfuse: captured %s into a CUDA graph", runner.graph_id)

    def _plan_outputs(self, outputs, args, role_of):
        """How each output is handed out: a constant, an input it aliases, a copy, or a
        view of the graph's memory (USER: on a storage made anew for each replay; SAVED /
        GRAD: a detached alias whose liveness the storage's use count shows)."""
        fixed_storages = {args[i].untyped_storage().data_ptr(): i for i in self.fixed}
        self.static_outputs = outputs
        self.storages = {}            # data_ptr -> (python storage, cdata, nbytes): memory the graph owns
        self.plan = []
        for k, out in enumerate(outputs):
            if not isinstance(out, torch.Tensor):
                self.plan.append(("value", out))
                continue
            storage = out.untyped_storage()
            if storage.data_ptr() in fixed_storages:
                i = fixed_storages[storage.data_ptr()]
                self.plan.append(("input", i, _meta(out, out.storage_offset() - args[i].storage_offset())))
                continue
            role = role_of(k)
            if role == USER and out.untyped_storage().nbytes() <= COPIED_OUTPUT_BYTES:
                self.plan.append(("copy", k))
                continue
            self.storages.setdefault(storage.data_ptr(), (storage, storage._cdata, storage.nbytes()))
            self.plan.append((role, k, storage.data_ptr(), _meta(out, out.storage_offset())))
        tracked = {entry[2] for entry in self.plan if entry[0] in (SAVED, GRAD)}
        self.tracked = [(self.storages[p][1], torch._C._storage_Use_Count(self.storages[p][1])) for p in tracked]
        if self.tracker is not None and self.kind == "forward":
            saved_inputs = {args[entry[1]].untyped_storage().data_ptr() for k, entry in enumerate(self.plan)
                            if entry[0] == "input" and role_of(k) == SAVED}
            self.tracker.saved_storages = tracked
            self.tracker.stable_storages = tracked | saved_inputs

    # ---- each call ---------------------------------------------------------------------
    def blocker(self, args):
        """Why this call must not replay, or None."""
        if not _same_pointers(args, self.fixed_ptrs, self.fixed):
            return "a parameter, buffer or saved tensor is not where it was when the graph was captured"
        for i in self.copied:
            arg, static = args[i], self.static_inputs[i]
            if arg.shape != static.shape or arg.dtype != static.dtype:
                return f"input {i} has another shape or dtype than when the graph was captured"
        for i in self.expanded:     # the compiled code checks that the values repeat along them
            if args[i].stride() != self.static_inputs[i].stride():
                return f"input {i} was expanded when the graph was captured and is not now"
        tracker = self.tracker
        if self.kind == "backward" and self._referenced():
            return "the gradients of its previous call are still referenced (gradient accumulation, " \
                   "zero_grad(set_to_none=False))"
        if self.kind == "forward" and tracker is not None and tracker.pending and self._referenced():
            return "called again before the backward of its previous call"
        if self.handed_out and (not self.driver.can_invalidate or self.thread != threading.get_ident()) \
                and self._live_outputs():
            return "the outputs of its previous call (from another thread, or on a torch that cannot mark them " \
                   "stale) are still referenced"
        return None

    def _referenced(self) -> bool:
        """Whether saved tensors or gradients of the last replay are still referenced."""
        return any(torch._C._storage_Use_Count(cdata) > baseline for cdata, baseline in self.tracked)

    def _live_outputs(self):
        return [ref for ref in self.handed_out if not ref.expired()]

    def replay(self, args):
        self._follow_stream()
        if self.copied:     # before invalidating: an input may be an output of the last replay
            sources, targets = [], []
            for i, target in zip(self.copied, self.copy_targets):
                if args[i].data_ptr() != self.static_inputs[i].data_ptr():
                    sources.append(_writable_source(args[i], target))
                    targets.append(target)
            if targets:
                torch._foreach_copy_(targets, sources)
                metrics.cudagraph_input_copies += len(targets)
        for ref in self._live_outputs():    # torch's rule: a new replay overwrites them
            self.driver.invalidate(ref.cdata)
        inputs = list(args)
        args.clear()
        self.driver.replay(self.graph)
        metrics.cudagraph_replays += 1
        self.thread = threading.get_ident()
        if self.tracker is not None and self.tracked and self.kind == "forward":
            self.tracker.pending = True
        return self._hand_out(inputs)

    def _hand_out(self, inputs):
        from .wrapper_helpers import reinterpret_tensor
        results, fresh = [], {}
        for entry in self.plan:
            kind = entry[0]
            if kind == "value":
                results.append(entry[1])
            elif kind == "input":
                _, i, meta = entry
                arg = inputs[i]
                same = arg.shape == meta["size"] and arg.stride() == meta["stride"] and meta["storage_offset"] == 0
                results.append(arg if same else reinterpret_tensor(arg, meta["size"], meta["stride"],
                                                                   meta["storage_offset"]))
            elif kind == "copy":
                results.append(self.static_outputs[entry[1]].clone())
            elif kind == USER:
                _, _, ptr, meta = entry
                if ptr not in fresh:
                    fresh[ptr] = torch._C._construct_storage_from_data_pointer(ptr, self.device, self.storages[ptr][2])
                results.append(self.driver.tensor_on(fresh[ptr], meta))
            else:       # SAVED, GRAD: aliases of the graph's memory, watched through its use count
                results.append(self.static_outputs[entry[1]].detach())
        from torch.multiprocessing.reductions import StorageWeakRef
        self.handed_out = [StorageWeakRef(storage) for storage in fresh.values()]
        return results

    def _follow_stream(self):
        """A replay on another stream than the last one waits for the last one's work."""
        raw = self.driver.current_raw_stream(self.device)
        if self.stream is not None and self.stream[0] == raw:
            return
        current = self.driver.current_stream(self.device)
        if self.stream is not None:
            current.wait_stream(self.stream[1])
        self.stream = (raw, current)


# Captures whose runner is gone (its function was freed, or torch._dynamo.reset()) while
# outputs handed out from their memory are still referenced: the outputs' storages do not
# own that memory, so the capture (its graph, its pool) stays until they are dropped.
_retired = []


def _retire(captured):
    _retired[:] = [c for c in _retired if c._live_outputs()]
    if captured._live_outputs():
        _retired.append(captured)


def _retains_graph() -> bool:
    """Whether the running backward keeps its graph (``retain_graph=True``)."""
    keep = getattr(torch._C._autograd, "_get_current_graph_task_keep_graph", None)
    try:
        return bool(keep()) if keep is not None else False
    except RuntimeError:      # no backward running
        return False


_CAPTURE_LOCK = threading.Lock()
_CAPTURE_STREAMS = {}


def _capture_stream(device):
    """The one stream captures of ``device`` run on (made once, like torch's graph pools)."""
    if device.index not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[device.index] = torch.cuda.Stream(device)
    return _CAPTURE_STREAMS[device.index]


def _clear_cublas_workspaces():
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()


def _device_of(args):
    for arg in args:
        if isinstance(arg, torch.Tensor):
            if arg.device.type not in DRIVERS:
                raise _CannotCapture(f"a tensor on {arg.device}")
            return arg.device
    return torch.device("cuda", torch.cuda.current_device())


def _meta(tensor, storage_offset):
    return {"size": tuple(tensor.shape), "stride": tuple(tensor.stride()), "storage_offset": storage_offset,
            "dtype": tensor.dtype}


def _tensor_on(storage, meta):
    tensor = torch.empty(0, dtype=meta["dtype"], device=storage.device)
    return tensor.set_(storage, meta["storage_offset"], meta["size"], meta["stride"])


def _same_pointers(args, pointers, indices) -> bool:
    if not indices:
        return True
    check = getattr(torch._C, "_tensors_data_ptrs_at_indices_equal", None)
    if check is not None:
        return check(args, pointers, indices)
    return all(args[i].data_ptr() == pointers[i] for i in indices)


def _expanded_dims(tensor):
    return [d for d, (n, s) in enumerate(zip(tensor.shape, tensor.stride())) if n > 1 and s == 0]


def _static_buffer(arg):
    """A buffer of ``arg``'s layout that the graph reads instead of the caller's tensor."""
    return torch.empty_strided(arg.shape, arg.stride(), dtype=arg.dtype, device=arg.device)


def _writable(tensor):
    """``tensor`` without its expanded (stride 0) dims: what a copy-in writes."""
    for d in _expanded_dims(tensor):
        tensor = tensor.narrow(d, 0, 1)
    return tensor


def _writable_source(source, target):
    """The part of an input that fills ``target`` (``_writable`` of the static buffer)."""
    if source.shape == target.shape:
        return source
    for d, (have, want) in enumerate(zip(source.shape, target.shape)):
        if have != want:
            source = source.narrow(d, 0, want)
    return source
