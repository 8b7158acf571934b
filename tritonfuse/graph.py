"""GraphLowering: runs an aten FX graph through the lowerings to build the IR.

Ops without a lowering, or whose lowering declines (``Unsupported``), become
``FallbackKernel``s that call the aten op at run time; each is logged once with its
reason and recorded in ``tritonfuse.metrics.fallbacks``.
"""
import logging
import operator
import threading

import sympy
import torch
import torch.fx

from . import metrics, sym
from .compile_options import CompileOptions
from .config import realize_loads_threshold, realize_reads_threshold
from .ir import (
    Buffer, ComputedBuffer, FallbackKernel, FallbackOutput, GenericView, InputBuffer, Layout, Pointwise,
    ReinterpretView, StorageBox, TensorBox, as_strided_buffer, realize_with_strides, same_strides, storage_of,
    strided_layout_of,
)
from .codegen.registry import prefers_materialized_reuse, prefers_online_softmax
from .layout_opt import (
    CONV_ARGS, LayoutPlan, channels_last_strides, conv_operands_needed, has_strides, is_channels_last,
    onednn_miscomputes, walks_channels_last,
)
from .lowering import Unsupported, lowerings
from .lowering.input_mutation import write_into_inputs
from .lowering.reductions import sumexp, sumexp_of_finite_shift
from .host_scalars import host_fill_value
from .lowering.registry import make_loader
from .patterns import match_online_softmax_sum

log = logging.getLogger("tritonfuse")
aten = torch.ops.aten
_logged_fallbacks = set()
# The graph each thread is lowering (compiles are serialized by compile_lock.py; a
# thread-local keeps one thread's lowering from ever registering into another's graph).
_lowering = threading.local()


def current_graph() -> "GraphLowering":
    graph = getattr(_lowering, "graph", None)
    assert graph is not None, "no graph is being lowered"
    return graph


def _devices_of(args, kwargs) -> set:
    """The devices of an op's IR tensor arguments (lists of them included), but for 0-d CPU
    values not held in a buffer: eager mixes 0-d CPU tensors into GPU ops, and such a value
    (a constant, a size) is computed inside the GPU kernel that reads it."""
    leaves = torch.utils._pytree.tree_leaves((args, kwargs), is_leaf=lambda x: isinstance(x, TensorBox))
    return {leaf.get_device() for leaf in leaves if isinstance(leaf, TensorBox) and not _computed_cpu_scalar(leaf)}


def _computed_cpu_scalar(value: TensorBox) -> bool:
    box = storage_of(value)
    return value.get_device().type == "cpu" and len(value.get_size()) == 0 \
        and box is not None and not box.is_realized()


class GraphLowering(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, example_inputs, graph_id: str = "graph", options=None,
                 layout_plan: LayoutPlan = None):
        super().__init__(gm)
        self.example_inputs = example_inputs
        self.graph_id = graph_id
        self.options = options if options is not None else CompileOptions.from_torch_compile()
        # channels_last feature maps (layout_opt.py); off: every layout is eager's
        self.layout_plan = layout_plan if layout_plan is not None else LayoutPlan()
        self._channels_last_copies = {}   # (buffer name, strides, offset) -> its channels_last copy
        self.buffers = []            # ComputedBuffer and FallbackOutput, in creation order
        self.operations = []         # ComputedBuffer and FallbackKernel: the order they run in
        self.fallback_kernels = []
        self.graph_inputs = {}       # name -> InputBuffer
        self.input_order = []        # placeholder names in call order
        self.constants = {}          # name -> tensor
        self.constant_targets = {}   # name -> the get_attr target it came from
        self.outputs = []            # IR buffers / views, in output order
        self.name_to_buffer = {}
        self.current_node = None
        self.lowered = {}            # fx node -> its lowered value (for graph-level rewrites)
        self._placeholder_index = 0
        self.sizevars = sym.current_sizevars()
        # size symbol -> how the generated code reads it ("arg0", "arg2.size(1)"), or None
        # for a symbol a fallback produces (``.item()``): bound where that fallback runs
        self.symbol_sources = {}
        self.host_scalars = []       # symbols of 0-d CPU inputs read on the host (_host_scalar)
        # (graph input, its new value) of each copy_ into an input (lowering/input_mutation.py)
        self.input_mutations = []

    # ---- names and registration -----------------------------------------------------
    def register_buffer(self, buffer: Buffer) -> str:
        buffer.name = f"buf{len(self.buffers)}"
        self.buffers.append(buffer)
        self.name_to_buffer[buffer.name] = buffer
        if isinstance(buffer, ComputedBuffer):
            self.operations.append(buffer)
        return buffer.name

    def get_dtype(self, name: str) -> torch.dtype:
        return self.name_to_buffer[name].get_dtype()

    # ---- fx.Interpreter hooks -------------------------------------------------------
    def run(self, *args):
        previous, _lowering.graph = getattr(_lowering, "graph", None), self
        try:
            return super().run(*args)
        finally:
            _lowering.graph = previous

    def placeholder(self, target, args, kwargs):
        example = self.example_inputs[self._placeholder_index]
        self._placeholder_index += 1
        name = f"arg{len(self.input_order)}"
        self.input_order.append(name)
        if isinstance(example, torch.Tensor):
            if self._is_host_scalar(example):
                return self._host_scalar(name, example)
            buffer = self._make_input(name, example)
            self.graph_inputs[name] = buffer
            return TensorBox(StorageBox(buffer))
        if isinstance(example, (torch.SymInt, torch.SymFloat, int, float)) and not isinstance(example, bool):
            expr = sym.sint(example) if not isinstance(example, float) else sympy.Float(example)
            self._bind(expr, name)
            return expr     # a size (or scalar) passed as an argument: a sympy expression
        if self.current_node.users:
            raise Unsupported(f"non-tensor graph input {type(example).__name__}")
        return example

    def _is_host_scalar(self, tensor):
        """A 0-d CPU tensor in a graph on another device (Dynamo passes a Python float so,
        when it does not specialize it): eager lets it mix with GPU tensors, and kernels on
        the GPU cannot read CPU memory."""
        return (tensor.dim() == 0 and tensor.device.type == "cpu" and not tensor.is_complex()
                and any(isinstance(t, torch.Tensor) and t.device.type != "cpu" for t in self.example_inputs))

    def _host_scalar(self, name, tensor):
        """Read the value on the host (``zh0 = arg1.item()``) and pass it to kernels as a scalar."""
        floating = tensor.dtype.is_floating_point
        symbol = sympy.Symbol(f"{'zh' if floating else 'uh'}{len(self.host_scalars)}",
                              real=True, integer=not floating)
        self.host_scalars.append(symbol)
        self.symbol_sources[symbol] = f"{name}.item()"
        return TensorBox.create(Pointwise(self._accelerator(tensor), tensor.dtype, make_loader(symbol, tensor.dtype), [],
                                          origins=(name,)))

    def _accelerator(self, host_tensor):
        """The device of the graph's first non-CPU input (where a host scalar's readers run)."""
        return next((t.device for t in self.example_inputs if isinstance(t, torch.Tensor) and t.device.type != "cpu"),
                    host_tensor.device)

    def _bind(self, expr, source):
        """Generated code reads the size symbol ``expr`` from ``source`` (if not bound yet)."""
        if isinstance(expr, sympy.Symbol) and sym.is_size_symbol(expr):
            self.symbol_sources.setdefault(expr, source)

    def unbound_symbols(self, expr) -> set:
        return sym.size_symbols(expr) - set(self.symbol_sources)

    def get_attr(self, target, args, kwargs):
        value = getattr(self.module, target)
        if not isinstance(value, torch.Tensor):
            return value
        if self._is_host_scalar(value):   # torch.tensor(3) in a GPU graph: its value, inlined
            from torch._subclasses.fake_tensor import unset_fake_temporarily
            with unset_fake_temporarily():   # lowering may run under the graph's fake mode
                number = value.item()
            return TensorBox.create(Pointwise(self._accelerator(value), value.dtype,
                                              make_loader(number, value.dtype), [], origins=(target,)))
        name = f"const{len(self.constants)}"
        self.constants[name] = value
        self.constant_targets[name] = target
        buffer = self._make_input(name, value)
        return TensorBox(StorageBox(buffer))

    def _make_input(self, name, tensor):
        size, stride = sym.sizes_of(tensor.shape), sym.sizes_of(tensor.stride())
        for d, (length, step) in enumerate(zip(size, stride)):
            self._bind(length, f"{name}.size({d})")
            self._bind(step, f"{name}.stride({d})")
        buffer = InputBuffer(name, Layout(tensor.device, tensor.dtype, size, stride))
        buffer.storage_offset = tensor.storage_offset()
        self.name_to_buffer[name] = buffer
        return buffer

    def call_function(self, target, args, kwargs):
        if target is operator.getitem:
            return args[0][args[1]]
        scalar = self._symbolic_scalar(self.current_node)
        if scalar is not None:
            return scalar
        rewritten = self._rewrite(self.current_node)
        if rewritten is not None:
            return rewritten
        if self.layout_plan.enabled and getattr(target, "overloadpacket", None) in READS_STORAGE_ORDER:
            args = (self._in_eagers_storage(args[0], self.current_node.args[0]),) + tuple(args[1:])
        lowering = lowerings.get(target)
        reason = None
        if lowering is None:
            reason = "no lowering"
        elif len(devices := _devices_of(args, kwargs)) > 1:
            # a GPU op reading a tensor the graph made on the CPU (BEiT's relative position
            # index, built by torch.arange without a device): eager's op takes it, a kernel on
            # the GPU cannot read CPU memory
            reason = f"inputs on several devices ({', '.join(sorted(map(str, devices)))})"
        else:
            try:
                return lowering(*args, **kwargs)
            except Unsupported as error:
                reason = str(error)
        return self.make_fallback(target, args, kwargs, reason)

    def _symbolic_scalar(self, node):
        """The value of a node that computes a size or scalar (``sym_size``, ``s0 * 4``):
        the expression Dynamo recorded, when every symbol in it is known here."""
        meta = node.meta.get("val")
        if isinstance(meta, bool) or not isinstance(meta, (int, float, torch.SymInt, torch.SymFloat)):
            return None
        expr = sympy.Float(meta) if isinstance(meta, float) else sym.sint(meta)
        return expr if not self.unbound_symbols(expr) else None

    def _rewrite(self, node):
        """Graph-level rewrites the backend of the node's device asks for (patterns.py)."""
        match = match_online_softmax_sum(node)
        if match is None:
            return None
        x = self.lowered.get(match.x)
        if not isinstance(x, TensorBox) or not prefers_online_softmax(x.get_device().type):
            return None
        keepdim = node.args[2] if len(node.args) > 2 else node.kwargs.get("keepdim", False)
        try:
            if match.finite_max is None:
                return sumexp(x, match.dims, keepdim)
            return sumexp_of_finite_shift(x, self.lowered[match.finite_max], match.dims, keepdim)
        except Unsupported:
            return None

    def run_node(self, node):
        self.current_node = node
        result = super().run_node(node)
        self.lowered[node] = result   # fx.Interpreter drops env entries after their last use
        if isinstance(result, TensorBox) and len(node.users) > 1:
            self._maybe_realize_reused(result, len(node.users))
        return result

    def output(self, target, args, kwargs):
        results = args[0]
        nodes = list(self.current_node.args[0])
        metas = [n.meta.get("val") if isinstance(n, torch.fx.Node) else None for n in nodes]
        self._realize_shared_output_bases(results, metas)
        compact = self._saved_views_to_compact(results, metas)
        if compact:
            metrics.add("compacted_saved_views", len(compact))
        for position, (value, meta, node) in enumerate(zip(results, metas, nodes)):
            if position in compact:
                self.outputs.append(_dense_copy(value, meta))
            elif position in self.layout_plan.free_outputs:
                self.outputs.append(self._realize_saved_output(value, meta, node))
            else:
                self.outputs.append(self._realize_output(value, meta))
        write_into_inputs(self)    # after every reader of the inputs' old values
        return results

    def _saved_views_to_compact(self, results, metas) -> set:
        """Positions of saved activations (outputs whose strides tritonfuse reports) that
        are views of a small part of a buffer this graph computed. Returned as views, they
        would keep the whole buffer alive until the backward, though the rest of it is dead
        after the forward: the value part of a merged q/k/v projection (merge_linears.py)
        that attention saves. Each is copied into a dense buffer of its own instead, when
        all the graph's outputs over that buffer are such views and together cover at most
        half of it."""
        free = self.layout_plan.free_outputs
        parts: dict = {}      # id(base buffer) -> (its numel, [(position, numel of the view)])
        blocked = set()       # bases another output returns whole or a user sees
        for position, (value, meta) in enumerate(zip(results, metas)):
            base, is_view = _computed_base(value)
            if base is None:
                continue
            numel = _static_numel(meta) if is_view and position in free else None
            base_numel = _static_numel(base.layout)
            if numel is None or base_numel is None:
                blocked.add(id(base))
                continue
            parts.setdefault(id(base), (base_numel, []))[1].append((position, numel))
        compact = set()
        for key, (base_numel, views) in parts.items():
            if key not in blocked and 2 * sum(numel for _, numel in views) <= base_numel:
                compact.update(position for position, _ in views)
        return compact

    def _realize_shared_output_bases(self, results, metas):
        """Outputs that are views of one value share memory in eager (``y, y.t()``): realize
        that value first, in eager's layout, so that each view output is a strided view of
        its buffer rather than a copy. An output that is the value itself fixes the layout."""
        bases = [_view_base(value) for value in results]
        shared = {id(b) for b in bases if b is not None and sum(b is other for other in bases) > 1}
        for value, meta, base in zip(results, metas, bases):
            if base is not None and id(base) in shared and not base.is_realized() and storage_of(value) is base:
                self._realize_output(value, meta)
        for base in bases:
            if base is not None and id(base) in shared and not base.is_realized():
                base.realize(self._layout_of_lowered(base, user_visible=True))

    def _layout_of_lowered(self, box, user_visible):
        """``preferred_layout`` of the value ``box`` holds, found from the FX node that made
        it; None (contiguous) where no node made it in a dense layout."""
        for node, value in self.lowered.items():
            if storage_of(value) is box:
                layout = self.preferred_layout(box, node, user_visible)
                if layout is not None:
                    return layout
        return None

    # ---- layout choice --------------------------------------------------------------
    def preferred_layout(self, box, node=None, user_visible=False):
        """The layout to realize ``box`` in, the value of FX node ``node`` (None: unknown).
        Under layout optimization (layout_opt.py) a 4-D value on a chain of convolutions,
        or computed element by element from a channels_last buffer, is channels_last,
        unless it is ``user_visible`` (a graph output the caller sees); otherwise eager's
        layout (the FX meta's) when it is dense; None: contiguous."""
        meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        eager = _dense_layout_of_meta(box, meta)
        if user_visible or not self.layout_plan.enabled or len(box.get_size()) != 4:
            return eager
        if isinstance(meta, torch.Tensor) and eager is None:
            return None   # eager's layout is not dense (an expand): keep to it
        if self.layout_plan.prefers_channels_last(node) or self._reads_channels_last(box.data):
            return _channels_last_layout(box)
        return eager

    def default_layout(self, data) -> Layout:
        """The layout of a computation realized with no layout asked for (a lowering that
        needs a buffer): channels_last where its dominant input is, else contiguous."""
        if self.layout_plan.enabled and len(data.get_size()) == 4 and self._reads_channels_last(data):
            return _channels_last_layout(data)
        return Layout.contiguous(data.get_device(), data.get_dtype(), data.get_size())

    def _reads_channels_last(self, data) -> bool:
        """Whether the pointwise computation ``data`` reads a channels_last buffer in
        channels_last order (element for element, or through a window as pooling does):
        its output then follows that layout, so that the kernel reads and writes in one
        order (Inductor: the fill order of a flexible layout follows its reads)."""
        if not isinstance(data, Pointwise):
            return False
        counter = _OpCounter()
        from .virtualized import set_ops_handler
        index = sym.index_vars("i", len(data.ranges))
        with set_ops_handler(counter):
            data.inner_fn(index)
        for name, read_index in counter.reads:
            buffer = self.name_to_buffer.get(name)
            layout = buffer.layout if buffer is not None else None
            if layout is not None and is_channels_last(layout.size, layout.stride) \
                    and walks_channels_last(read_index, index, data.ranges):
                return True
        return False

    def _in_eagers_storage(self, value, fx_value):
        """``value`` in eager's exact dense layout, for an op that reads its storage
        (``as_strided``): a value realized channels_last holds its elements in another
        order. Values eager itself holds as views of other storage are left as they are."""
        meta = _meta_tensor(fx_value)
        if meta is None or not isinstance(value, TensorBox) or meta.storage_offset() != 0:
            return value
        box = storage_of(value)
        eager = _dense_layout_of_meta(box if box is not None else value, meta)
        if eager is None:
            return value
        if box is not None and not box.is_realized():
            box.realize(eager)
            return value
        layout = strided_layout_of(value)
        if layout is None or (layout.offset == 0 and same_strides(layout, meta.shape, meta.stride())):
            return value
        copy = realize_with_strides(value, meta.shape, meta.stride())
        return TensorBox(StorageBox(copy))

    def _channels_last_conv_args(self, node, ir_args):
        """A 2-D convolution's feature maps and weight that its outputs read, channels_last:
        a value held in another layout (a graph input, a weight) is copied, once per graph."""
        ir_args = list(ir_args)
        for position in conv_operands_needed(node):
            value = ir_args[position]
            if isinstance(value, (Buffer, ReinterpretView)) and len(value.layout.size) == 4:
                ir_args[position] = self._channels_last_copy(value)
        return tuple(ir_args)

    def _channels_last_copy(self, value):
        layout = value.layout
        want = channels_last_strides(layout.size)
        if has_strides(layout.size, layout.stride, want):
            return value
        source = value.buffer if isinstance(value, ReinterpretView) else value
        key = (source.name, tuple(layout.size), tuple(layout.stride), layout.offset)
        if key not in self._channels_last_copies:
            boxed = TensorBox(value if isinstance(value, ReinterpretView) else StorageBox(value))
            self._channels_last_copies[key] = realize_with_strides(boxed, layout.size, want)
        return self._channels_last_copies[key]

    # ---- realization rules ----------------------------------------------------------
    def _maybe_realize_reused(self, value: TensorBox, users: int):
        """A pointwise value read by several consumers is recomputed by each, unless that
        is costly: many users, many loads, or (on backends that prefer it, like the C++
        one, where a row-sized buffer stays in cache) transcendental math."""
        box = storage_of(value)
        # a view read by several consumers (the rotary table's cos.unsqueeze(1), read for
        # q and for k in every layer): its costly base is what each would recompute
        through_view = box is None
        if through_view:
            box = _view_base(value)
        if box is None or box.is_realized() or not isinstance(box.data, Pointwise):
            return
        loads, expensive = count_ops(box.data)
        # in eager's layout: a fallback reading it later (SDPA, whose output follows its
        # query's layout) then gets what eager passes, and its outputs eager's strides
        layout = self.preferred_layout(box, self.current_node) if value.data is box else None
        if not through_view and (users > realize_reads_threshold or loads > realize_loads_threshold):
            box.realize(layout)
        elif expensive and prefers_materialized_reuse(box.data.get_device().type):
            box.realize(layout)

    def _realize_output(self, value, meta):
        """A graph output in eager's layout (exactly its strides, expanded dims too: the
        next graph, e.g. the backward reading a saved tensor, was traced with them)."""
        if value is None or not isinstance(value, TensorBox):
            return value
        if isinstance(meta, torch.Tensor) and meta.device.type != value.get_device().type:
            return self._copy_to_device(value, meta)
        want = (sym.sizes_of(meta.shape), sym.sizes_of(meta.stride())) if isinstance(meta, torch.Tensor) else None
        box = storage_of(value)
        if box is not None and not box.is_realized():
            found = realize_with_strides(value, *want) if want is not None else None
            return found if found is not None else box.realize()
        base = _view_base(value)
        if isinstance(value.data, GenericView) and base is not None and base.is_realized():
            found = value.data.realize_strided()   # a view of a realized buffer: keep it a view
            if found is not None:
                value = TensorBox(ReinterpretView(*found))
        layout = strided_layout_of(value)
        if layout is not None and self.layout_plan.enabled and want is not None and same_strides(layout, *want):
            return _with_exact_strides(value, layout, *want)
        if layout is not None and (want is None or same_strides(layout, *want)
                                   or (sym.is_static(layout.numel()) and sym.to_int(layout.numel()) <= 1)):
            return as_strided_buffer(value)
        # a view with other strides than eager's: copy it into eager's layout
        found = realize_with_strides(value, *want)
        if found is not None:
            return found
        copy = StorageBox(Pointwise(value.get_device(), value.get_dtype(), value.make_loader(),
                                    list(value.get_size()), origins=("clone",)))
        return copy.realize()

    def _realize_saved_output(self, value, meta, node):
        """A forward output saved for the backward, whose strides are reported to
        aot_autograd (layout_opt.py): realized in the preferred layout; a value already
        held channels_last stays as it is; anything else gets eager's layout."""
        box = storage_of(value)
        same_device = isinstance(meta, torch.Tensor) and isinstance(value, TensorBox) \
            and meta.device.type == value.get_device().type
        if same_device and box is not None and not box.is_realized():
            layout = self.preferred_layout(box, node)
            if layout is not None:
                return box.realize(layout)
        layout = strided_layout_of(value) if same_device else None
        if layout is not None and layout.offset == 0 and is_channels_last(layout.size, layout.stride):
            return as_strided_buffer(value)
        return self._realize_output(value, meta)

    def _copy_to_device(self, value, meta):
        """An output eager leaves on another device than the one the graph computed it on
        (a host scalar, inlined into the GPU's kernels, returned as it is): an aten copy,
        or, for a cast of a host scalar that eager keeps on the CPU, the value made there
        (no device-to-host copy, which would wait for every kernel queued before it)."""
        fill = host_fill_value(value, meta) if meta.device.type == "cpu" else None
        if fill is not None:
            kernel = self._add_fallback_kernel(aten.full.default, ([1] * meta.dim(), fill),
                                               {"dtype": meta.dtype, "device": meta.device},
                                               "a host scalar's cast that eager keeps on the CPU, made there")
        else:
            kernel = self._add_fallback_kernel(aten._to_copy.default, (self._fallback_inputs(value, None, exact=False),),
                                               {"device": meta.device}, "an output eager keeps on another device")
        return storage_of(self._fallback_outputs(kernel, meta, ())).data

    def _add_fallback_kernel(self, op, args, kwargs, reason) -> FallbackKernel:
        """A FallbackKernel running ``op`` on IR arguments, registered to run here."""
        kernel = FallbackKernel(name=f"fallback{len(self.fallback_kernels)}", op=op, args=tuple(args),
                                kwargs=kwargs, reason=reason)
        self.fallback_kernels.append(kernel)
        self.operations.append(kernel)
        return kernel

    # ---- fallbacks ------------------------------------------------------------------
    def make_fallback(self, target, args, kwargs, reason):
        """Run ``target`` as an aten call inside the compiled graph.

        Many aten ops (SDPA for the CPU, convolutions, ...) give outputs whose strides
        follow their inputs'. The graph recorded eager's strides for every value, so a
        fallback must either get its inputs in eager's layout or have its outputs read
        with the strides its actual inputs produce. Values not yet materialized are
        realized in eager's layout (free); a value already held in another layout is
        passed as it is and the op's output layouts come from running it on fake tensors
        of those layouts; if that cannot be done, the value is copied into eager's layout."""
        op_name = str(target)
        if op_name not in _logged_fallbacks:
            _logged_fallbacks.add(op_name)
            log.info("tritonfuse: %s runs as an aten fallback (%s)", op_name, reason)
        metrics.fallbacks[op_name] = reason
        node = self.current_node
        fx_kwargs = node.kwargs
        ir_args = self._fallback_inputs(args, node.args, exact=False)
        ir_kwargs = {k: self._fallback_inputs(v, fx_kwargs.get(k), exact=False) for k, v in kwargs.items()}
        meta = node.meta.get("val")
        # a convolution under layout optimization takes channels_last inputs, and its
        # outputs' strides always come from running it on them (they decide cuDNN's layout)
        channels_last_conv = self.layout_plan.enabled and target in CONV_ARGS and node in self.layout_plan.prefer
        if channels_last_conv and onednn_miscomputes(node):
            channels_last_conv = False
            ir_args = self._fallback_inputs(args, node.args, exact=True)
        if channels_last_conv:
            ir_args = self._channels_last_conv_args(node, ir_args)
        if channels_last_conv or _layouts_differ((ir_args, ir_kwargs), (node.args, fx_kwargs)):
            outputs = _fake_outputs(target, ir_args, ir_kwargs, node)
            if outputs is not None:
                meta = outputs
            else:
                ir_args = self._fallback_inputs(args, node.args, exact=True)
                ir_kwargs = {k: self._fallback_inputs(v, fx_kwargs.get(k), exact=True) for k, v in kwargs.items()}
        kernel = self._add_fallback_kernel(target, ir_args, ir_kwargs, reason)
        return self._fallback_outputs(kernel, meta, ())

    def strided_input(self, value, fx_value):
        """A buffer or strided view holding ``value`` (for a kernel that takes operands of
        any strides, as an aten call does): eager's layout, from the FX argument
        ``fx_value``, where ``value`` is not yet materialized."""
        return self._fallback_inputs(value, fx_value, exact=False)

    def _fallback_inputs(self, value, fx_value, exact):
        """IR buffers / strided views for a fallback's arguments (``fx_value``: the same
        argument in the FX graph, whose meta holds eager's layout). ``exact``: copy values
        held in another layout into eager's."""
        if isinstance(value, (list, tuple)):
            fx_items = fx_value if isinstance(fx_value, (list, tuple)) and len(fx_value) == len(value) \
                else [None] * len(value)
            return type(value)(self._fallback_inputs(v, f, exact) for v, f in zip(value, fx_items))
        if not isinstance(value, TensorBox):
            return value
        meta = _meta_tensor(fx_value)
        box = storage_of(value)
        if meta is not None and box is not None and not box.is_realized():
            layout = self.preferred_layout(box, fx_value)   # eager's layout (or channels_last), at no cost
            found = box.realize(layout) if layout is not None else realize_with_strides(value, meta.shape,
                                                                                          meta.stride())
            if found is not None:
                return found
        base = _view_base(value)
        if base is not None and base is not box and not base.is_realized():
            base.realize(self._layout_of_lowered(base, user_visible=False))
        found = as_strided_buffer(value)
        if exact and meta is not None and not same_strides(found.layout, meta.shape, meta.stride()):
            copy = realize_with_strides(TensorBox(found if isinstance(found, ReinterpretView) else StorageBox(found)),
                                        meta.shape, meta.stride())
            if copy is not None:
                return copy
        return found

    def _fallback_outputs(self, kernel, meta, path):
        if isinstance(meta, (torch.SymInt, torch.SymFloat)):   # e.g. .item(): a runtime scalar
            expr = sym.sint(meta)
            if isinstance(expr, sympy.Symbol) and self.unbound_symbols(expr):
                self.symbol_sources[expr] = None
                kernel.scalar_outputs.append((expr, path))
            return expr
        if isinstance(meta, torch.Tensor):
            layout = Layout(meta.device, meta.dtype, sym.sizes_of(meta.shape), sym.sizes_of(meta.stride()))
            output = FallbackOutput(name=None, layout=layout, kernel=kernel, path=path)
            self.register_buffer(output)
            kernel.outputs.append(output)
            return TensorBox(StorageBox(output))
        if isinstance(meta, (list, tuple)):
            return type(meta)(self._fallback_outputs(kernel, m, path + (i,)) for i, m in enumerate(meta))
        return meta


def _meta_tensor(fx_value):
    meta = fx_value.meta.get("val") if isinstance(fx_value, torch.fx.Node) else None
    return meta if isinstance(meta, torch.Tensor) else None


def _layouts_differ(ir_values, fx_values) -> bool:
    """Whether any IR argument of a fallback is held in other strides than eager's."""
    if isinstance(ir_values, dict):
        return any(_layouts_differ(v, fx_values.get(k) if isinstance(fx_values, dict) else None)
                   for k, v in ir_values.items())
    if isinstance(ir_values, (list, tuple)):
        fx_items = fx_values if isinstance(fx_values, (list, tuple)) and len(fx_values) == len(ir_values) \
            else [None] * len(ir_values)
        return any(_layouts_differ(v, f) for v, f in zip(ir_values, fx_items))
    if isinstance(ir_values, (Buffer, ReinterpretView)):
        meta = _meta_tensor(fx_values)
        return meta is None or not same_strides(ir_values.layout, meta.shape, meta.stride())
    return False


def _fake_outputs(target, ir_args, ir_kwargs, node):
    """The fake tensors ``target`` returns for inputs in the IR's layouts (their strides
    are the ones the real call will give), or None when the op cannot be run on fakes."""
    from torch._guards import detect_fake_mode
    metas = [n.meta.get("val") for n in node.all_input_nodes] + [node.meta.get("val")]
    fake_mode = detect_fake_mode([m for m in metas if isinstance(m, torch.Tensor)])
    if fake_mode is None:
        return None

    def fake(value):
        if isinstance(value, (list, tuple)):
            return type(value)(fake(v) for v in value)
        if isinstance(value, dict):
            return {k: fake(v) for k, v in value.items()}
        if isinstance(value, (Buffer, ReinterpretView)):
            layout = value.layout
            return torch.empty_strided(layout.int_size(), layout.int_stride(), dtype=layout.dtype,
                                       device=layout.device)
        return value
    try:
        with fake_mode:
            return target(*fake(ir_args), **fake(ir_kwargs))
    except Exception as error:  # e.g. a data-dependent output size
        log.debug("tritonfuse: cannot run %s on fake tensors (%s); its inputs get eager's layout", target, error)
        return None


def _dense_layout_of_meta(box, meta):
    """The layout of the FX value ``meta`` for ``box`` when it is dense and of its size."""
    if not isinstance(meta, torch.Tensor):
        return None
    size, stride = sym.sizes_of(meta.shape), sym.sizes_of(meta.stride())
    if not _is_dense(size, stride) or not sym.same_sizes(box.get_size(), size):
        return None
    return Layout(box.get_device(), box.get_dtype(), size, stride)


def _with_exact_strides(value, layout, size, stride):
    """The buffer or view ``value`` (held in ``layout``, which has ``stride`` on every dim
    longer than 1) seen with exactly ``stride``: a 1x1 convolution's weight gradient from
    channels_last inputs has strides (C, 1, C, C) where eager's are (C, 1, 1, 1)."""
    found = as_strided_buffer(value)
    if all(sym.same_size(have, want) for have, want in zip(layout.stride, stride)):
        return found
    buffer = found.buffer if isinstance(found, ReinterpretView) else found
    return ReinterpretView(buffer, Layout(layout.device, layout.dtype, list(size), list(stride), layout.offset))


def _channels_last_layout(node) -> Layout:
    """A channels_last layout for the 4-D value ``node`` computes."""
    size = list(node.get_size())
    return Layout(node.get_device(), node.get_dtype(), size, channels_last_strides(size))


def _computed_base(value):
    """(the buffer this graph computed that ``value`` is or views, whether it is a view of
    it), or (None, False) for anything else (a graph input, a value not yet realized)."""
    if not isinstance(value, TensorBox):
        return None, False
    data = value.data
    if isinstance(data, ReinterpretView):
        base = data.buffer
    else:
        box = _view_base(value)
        base = box.data if box is not None and box.is_realized() else None
    if base is None or isinstance(base, InputBuffer):
        return None, False
    return base, not isinstance(data, StorageBox)


def _static_numel(value):
    """The number of elements of a tensor meta or a layout, or None if not a number."""
    size = value.shape if isinstance(value, torch.Tensor) else getattr(value, "size", None)
    if size is None:
        return None
    numel = 1
    for s in size:
        if not sym.is_static(s):
            return None
        numel *= sym.to_int(s)
    return numel


def _dense_copy(value, meta):
    """``value`` copied into a new buffer with no gaps, its dims in eager's order of strides."""
    size = sym.sizes_of(meta.shape)
    order = sorted(range(meta.dim()), key=lambda d: (meta.stride()[d], -d))
    stride, running = [0] * meta.dim(), 1
    for d in order:
        stride[d] = running
        running *= int(meta.shape[d])
    return realize_with_strides(value, size, stride)


def _view_base(value):
    """The StorageBox under a value and any chain of views over it, or None."""
    data = value.data if isinstance(value, TensorBox) else value
    while isinstance(data, GenericView):
        data = data.data
    return data if isinstance(data, StorageBox) else None


def _is_dense(size, stride):
    """True when the strides describe a non-overlapping, gap-free permutation of dims."""
    pairs = sorted(((sym.hint(st), st, sz) for sz, st in zip(size, stride) if sz != 1), key=lambda p: p[0])
    expected = sympy.Integer(1)
    for _, st, sz in pairs:
        if not sym.same_size(st, expected):
            return False
        expected = expected * sz
    return True


# ops whose result depends on the order of their input's storage, not only its values
READS_STORAGE_ORDER = (aten.as_strided, aten.as_strided_copy)

EXPENSIVE_OPS = {"exp", "exp2", "expm1", "log", "log2", "log1p", "tanh", "sigmoid", "erf", "pow", "sin", "cos",
                 "tan"}


class _OpCounter:
    def __init__(self):
        self.loads = 0
        self.expensive = 0
        self.reads = []   # (buffer name, index) of each load

    def load(self, name, index):
        self.loads += 1
        self.reads.append((name, index))
        return "v"

    def indirect_indexing(self, value, size):
        return sympy.Symbol("indirect", integer=True)

    def masked(self, mask, body, other):
        return body()

    def __getattr__(self, name):
        if name in EXPENSIVE_OPS:
            self.expensive += 1
        return lambda *args, **kwargs: "v"


def _evaluate(pointwise: Pointwise, index) -> _OpCounter:
    from .virtualized import set_ops_handler
    counter = _OpCounter()
    with set_ops_handler(counter):
        pointwise.inner_fn(index)
    return counter


def pointwise_reads(pointwise: Pointwise, index):
    """(buffer name, storage index) of each load of ``pointwise`` at ``index``."""
    return _evaluate(pointwise, index).reads


def count_ops(pointwise: Pointwise):
    """(loads, transcendental ops) in one evaluation of ``pointwise``."""
    counter = _evaluate(pointwise, sym.index_vars("i", len(pointwise.ranges)))
    return counter.loads, counter.expensive

