"""Memory planning: which memory each buffer of the wrapper is written into.

Computed once per graph from the scheduler's order and last uses, before code generation.
The wrapper only prints the decisions; a kernel that writes an output in place gets one
``in_out_ptr`` for the buffer it reads and the output it writes over it.

For each buffer a kernel writes (in execution order), the first that applies:

  in place  The kernel reads a buffer A for the last time and A can hold the output B:
            same device, dtype and memory span (and layout, for a graph output); of the
            nodes left to run, B's (pointwise) node is the only one that reads A, and it
            reads A only at the element it writes.
            ``buf3 = buf1; del buf1  # in place``
  reuse     A buffer that died before this kernel has the same device, dtype and storage
            size (sizes provably equal when they are symbolic): the most recently freed
            one is taken. ``buf5 = buf2; del buf2  # reuse`` (through ``reinterpret_tensor``
            when the layouts differ).
  allocate  ``empty_strided``.

A matmul run as an aten fallback (``OUT_VARIANT_OPS``) allocates its own result unless a
dead buffer of the result's exact layout is free: then it writes into it through its out=
overload (``buf3 = buf1; del buf1  # reuse`` and ``aten.mm.out(..., out=buf3)``). Holding a
dead buffer for a later kernel while such a fallback allocated was one hidden-state-sized
buffer above Inductor's peak in LLM backwards (docs/results/memory.md, stop 27). Any
other fallback that allocates empties the pool: a dead buffer is then freed where it died
rather than held across the fallback's allocation for a later kernel (that kernel
allocates instead; the bytes allocated never exceed what holding it would).

Graph inputs are freed (their names deleted) after their last use like any buffer, and
before the first kernel when nothing reads them: the backward graph's inputs are the
activations the forward saved, and aot_autograd hands them over (the caller keeps no
reference), so each is released as soon as the backward is done with it rather than at
the end of the graph. Their memory is never taken over (a caller may hold them: weights),
but for the backward's donated inputs (compile_options.py): aot_autograd holds no other
reference to them, so like dead buffers they are written over in place or reused (the
gradient of the logits over the saved logits). ``OVERWRITTEN_INPUTS`` in the generated
module lists them (the first call keeps copies for its eager retry, compile_fx.py).

Never taken over, because their memory outlives their name or is not the graph's to
reuse: graph inputs (but donated ones) and constants, graph outputs (and the buffers
outputs are views of), a scatter's target (the ``MutationBuffer`` result is bound to its
memory and keeps it), a cat's slice but the last (``ConcatSlice``: the last is bound to the
first's memory), and every tensor argument and output of a fallback whose op may
alias or mutate its arguments (its schema says so, or it has no schema).

A graph input written in place (``ir.InputMutation``) is such a target too: its writer is
bound to the input's tensor, the kernel gets one ``in_out_ptr`` for the input it reads and
writes (``written_inputs``), and the input's name lives to the end of the call (the wrapper
copies it back where it had to be laid out anew: codegen/wrapper.py).
"""
from dataclasses import dataclass, field
from typing import Dict, List, Tuple

import torch

from .. import sym
from ..dependencies import extract_deps
from ..ir import ComputedBuffer, memory_target
from ..scheduler import FallbackNode

IN_PLACE = "in place"
REUSE = "reuse"


@dataclass
class MemoryPlan:
    takes: Dict[str, Tuple[str, str]] = field(default_factory=dict)  # buffer -> (IN_PLACE | REUSE, dead buffer)
    frees: List[List[str]] = field(default_factory=list)   # per group: buffers to free after it
    unused_inputs: List[str] = field(default_factory=list)  # graph inputs nothing reads: freed first
    overwritten_inputs: Tuple[int, ...] = ()   # positions of the donated inputs taken over
    written_inputs: Dict[str, str] = field(default_factory=dict)   # InputMutation node -> the graph input

    def in_place_outputs(self, names) -> Dict[str, str]:
        """{output: the input it is written over} for the outputs ``names`` of one kernel
        (a graph input's new value is written over the input: one pointer, never two that
        alias)."""
        found = {name: self.takes[name][1] for name in names if name in self.takes and self.takes[name][0] == IN_PLACE}
        found.update((name, self.written_inputs[name]) for name in names if name in self.written_inputs)
        return found

    def frees_after(self, group_index: int) -> List[str]:
        return self.frees[group_index]


def plan_memory(graph, scheduler) -> MemoryPlan:
    groups = scheduler.groups
    last_use = scheduler.last_uses()
    inputs = set(graph.graph_inputs)
    donated = donated_inputs(graph) - scheduler.output_names
    keep = scheduler.output_names | (inputs - donated) | set(graph.constants)
    shared, bound = _shared_memory(scheduler)
    output_memory = _output_memory(scheduler)
    plan = MemoryPlan()
    plan.written_inputs = written_inputs(scheduler)
    pinned = keep | shared | set(plan.written_inputs)   # (a graph input's memory, under another name)
    dead_after = [[] for _ in groups]
    for name, last in sorted(last_use.items()):
        if name in plan.written_inputs.values():   # kept to the end: the wrapper may copy it back
            continue
        if name not in keep or (name in inputs and name not in scheduler.output_names):
            dead_after[last].append(name)

    plan.unused_inputs = sorted(inputs - set(last_use) - scheduler.output_names)
    allocated = set(donated)   # buffers the wrapper allocates, a fallback returns or aot_autograd donates
    pool = []           # dead buffers free to take over, most recently freed last
    for i, group in enumerate(groups):
        taken_here = set()
        if isinstance(group, FallbackNode):
            allocated |= set(group.output_names)   # the op allocates its own results
            buffer = _out_variant_output(graph, group)
            source = _reusable(graph, buffer, pool, exact_only=True) if buffer is not None else None
            if source is not None:   # written through its out= overload into a dead buffer
                plan.takes[buffer.name] = (REUSE, source)
                pool.remove(source)
            elif any(name not in shared for name in group.output_names):
                pool.clear()   # it allocates: the dead buffers are freed where they died, not held
        for buffer in _allocated_buffers(scheduler, group):
            allocated.add(buffer.name)
            if buffer.name in bound:
                continue
            source = _in_place_source(scheduler, graph, group, buffer, dead_after[i], allocated, pinned,
                                      taken_here)
            if source is not None:
                plan.takes[buffer.name] = (IN_PLACE, source)
                taken_here.add(source)
                continue
            source = _reusable(graph, buffer, pool, exact_only=buffer.name in output_memory)
            if source is not None:
                plan.takes[buffer.name] = (REUSE, source)
                pool.remove(source)
        freed = [n for n in dead_after[i] if n not in taken_here]
        plan.frees.append(freed)
        pool.extend(n for n in freed if n in allocated and n not in pinned and _poolable(graph.name_to_buffer[n]))
    taken = {source for _, source in plan.takes.values()}
    plan.frees = [[n for n in names if n not in taken] for names in plan.frees]
    plan.overwritten_inputs = tuple(i for i, name in enumerate(graph.input_order) if name in taken)
    return plan


def written_inputs(scheduler) -> Dict[str, str]:
    """{node: the graph input it writes its value into} (``ir.InputMutation``)."""
    return {node.name: node.written_input for group in scheduler.groups if not isinstance(group, FallbackNode)
            for node in group.nodes if node.written_input is not None}


def donated_inputs(graph) -> set:
    """The names of the graph inputs aot_autograd donates (compile_options.py)."""
    names = graph.input_order
    return {names[i] for i in graph.options.donated_inputs if i < len(names) and names[i] in graph.graph_inputs}


def _allocated_buffers(scheduler, group):
    """The buffers a kernel writes to memory, in order (an empty kernel allocates its
    outputs fresh: nothing to plan)."""
    if isinstance(group, FallbackNode) or group.is_empty():
        return []
    internal = scheduler.internal_buffers(group)
    return [node.buffer for node in sorted(group.nodes, key=lambda n: n.position) if node.name not in internal]


# aten ops with one tensor result whose out= overload computes it as the op does: a matmul
# run on aten writes into a dead buffer of its result's layout (as Inductor's extern_kernels
# do) instead of allocating while the dead buffer is held for a later kernel
OUT_VARIANT_OPS = (torch.ops.aten.mm.default, torch.ops.aten.bmm.default, torch.ops.aten.addmm.default,
                   torch.ops.aten.baddbmm.default)


def _out_variant_output(graph, group):
    """The result buffer of a fallback that may write it through its out= overload, or None."""
    kernel = group.kernel
    if kernel.op not in OUT_VARIANT_OPS or len(kernel.outputs) != 1 or kernel.scalar_outputs \
            or kernel.outputs[0].path != ():
        return None
    return graph.name_to_buffer.get(kernel.outputs[0].name)


def _in_place_source(scheduler, graph, group, buffer, dying, allocated, pinned, taken_here):
    node = next(n for n in group.nodes if n.name == buffer.name)
    # a GEMM template reads whole rows and columns; a cat's first slice writes part of its memory
    if node.is_reduction() or node.is_template or node.is_concat_slice:
        return None
    readers = {}
    for other in group.nodes:
        for name in other.read_names:
            readers.setdefault(name, []).append(other)
    reads, write = extract_deps(node.buffer, node.x_sizes, node.r_sizes)
    for name in sorted(node.read_names):
        if name not in dying or name not in allocated or name in pinned or name in taken_here:
            continue
        # a graph output is never a reinterpreted tensor (as in ``_reusable``)
        fits = _same_layout if buffer.name in scheduler.output_names else _same_span
        if readers.get(name) != [node] or not fits(graph.name_to_buffer[name].layout, buffer.layout):
            continue
        deps = [dep for dep in reads if dep.name == name]
        if deps and all(not dep.indirect and dep.index == write.index for dep in deps):
            return name
    return None


def _reusable(graph, buffer, pool, exact_only):
    """The most recently freed buffer of ``pool`` that can hold ``buffer``, preferring one
    of the same layout. ``exact_only``: a graph output is never a reinterpreted tensor."""
    if not _poolable(buffer):
        return None
    candidates = [name for name in reversed(pool) if _same_storage(graph.name_to_buffer[name].layout, buffer.layout)]
    exact = [name for name in candidates if _same_layout(graph.name_to_buffer[name].layout, buffer.layout)]
    if exact:
        return exact[0]
    return candidates[0] if candidates and not exact_only else None


def _poolable(buffer) -> bool:
    layout = buffer.layout
    return layout.offset == 0 and not sym.same_size(layout.storage_size(), 0)


def _same_storage(a, b) -> bool:
    return a.device == b.device and a.dtype == b.dtype and sym.same_size(a.storage_size(), b.storage_size())


def _same_span(a, b) -> bool:
    """Same memory from offset 0 (sizes and strides may differ: a [2, 64, V] gradient over
    the [128, V] logits it reads; whether each element is read where it is written is the
    index comparison's to tell)."""
    return _same_storage(a, b) and sym.same_size(a.offset, 0) and sym.same_size(b.offset, 0)


def _same_layout(a, b) -> bool:
    return _same_storage(a, b) and sym.same_sizes(a.size, b.size) and sym.same_sizes(a.stride, b.stride) \
        and sym.same_size(a.offset, b.offset)


def _shared_memory(scheduler):
    """(shared, bound): buffers whose memory another name may share or a node may write
    into later, never taken over; buffers whose memory is another's, never planned."""
    shared, bound = set(), set()
    for group in scheduler.groups:
        if isinstance(group, FallbackNode):
            if _may_alias_or_mutate(group.kernel.op):
                shared |= set(group.read_names) | set(group.output_names)
            continue
        for node in group.nodes:
            target = memory_target(node.buffer)
            if target is not None:    # a scatter's result, a later cat slice: its target's memory
                shared.add(target.name)
                bound.add(node.name)
            elif isinstance(node.buffer, ComputedBuffer):
                _, write = extract_deps(node.buffer, node.x_sizes, node.r_sizes)
                if write.name != node.name:
                    shared |= {write.name, node.name}
                    bound.add(node.name)
    return shared, bound


def _output_memory(scheduler) -> set:
    """The graph's outputs and the buffers whose memory one of them is bound to (the first
    slice of a cat that is an output, a scatter's target): never a reinterpreted tensor."""
    names = set(scheduler.output_names)
    nodes = [node for group in scheduler.groups if not isinstance(group, FallbackNode) for node in group.nodes]
    for node in sorted(nodes, key=lambda n: n.position, reverse=True):   # a target comes before its writer
        target = memory_target(node.buffer)
        if target is not None and node.name in names:
            names.add(target.name)
    return names


def _may_alias_or_mutate(op) -> bool:
    schema = getattr(op, "_schema", None)
    if not isinstance(op, torch._ops.OpOverload) or schema is None:
        return True
    return any(arg.alias_info is not None for arg in (*schema.arguments, *schema.returns))
