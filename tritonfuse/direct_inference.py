"""Inference graphs without aot_autograd's runtime wrapper, when that wrapper has nothing to do.

aot_autograd wraps every compiled graph in Python that writes mutated inputs back, rebuilds
outputs that alias inputs or each other, turns grad mode off around the call, disables
autocast, de-duplicates inputs and prepends lifted parameters. For a plain inference graph
none of this applies, yet the wrapper's frames still run on every call: about 3 us with
warm caches and 20 us after a kernel has streamed megabytes through them, which is 10 % of
a 0.2 ms layer norm.

``InferenceShortcut`` watches the inference compile and, when aot_autograd's own metadata
says the wrapper would pass arguments and outputs through unchanged, hands Dynamo a
callable that calls the compiled graph directly. Any doubt (a mutation, an aliased output,
a tensor subclass, autocast, duplicated or lifted inputs, a metadata field this torch
version lacks) keeps aot_autograd's wrapper, which is always correct.
"""
import logging

import torch

log = logging.getLogger("tritonfuse")


class InferenceShortcut:
    def __init__(self, gm: torch.fx.GraphModule, example_inputs):
        example_inputs = list(example_inputs)
        self.num_inputs = len(example_inputs)
        self.eligible_inputs = _plain_distinct_tensors(example_inputs) and _has_no_lifted_state(gm)
        self.grad_enabled = torch.is_grad_enabled()
        self.autocast = _any_autocast_enabled()
        self.compiled = None      # the inference graph's callable, when the shortcut applies
        self.compiles = 0

    def wrap(self, inference_compiler):
        """The inference compiler to hand aot_autograd: compiles, then decides."""
        def compile_inference(aten_gm, aten_inputs):
            compiled = inference_compiler(aten_gm, aten_inputs)
            self.compiles += 1
            why_not = self._why_not(aten_gm)
            if why_not is None:
                self.compiled = compiled
            else:
                log.debug("tritonfuse: inference graph keeps aot_autograd's runtime wrapper: %s", why_not)
            return compiled
        return compile_inference

    def callable_or(self, aot_compiled):
        """What to give Dynamo: the direct call if the shortcut applies, else aot's function."""
        from . import config, metrics
        if not config.direct_inference or self.compiled is None or self.compiles != 1:
            return aot_compiled
        metrics.direct_inference_graphs += 1
        return _direct_call(self.compiled, self.grad_enabled)

    def decide_from_cache(self, compiled, aten_gm, meta):
        """For aot_autograd's result loaded from the disk (aot_cache.py): the direct call to
        the inference graph if the shortcut applies, else None."""
        self.compiles += 1
        if self._why_not_given(aten_gm, meta) is None:
            self.compiled = compiled
        return self.callable_or(None)

    def _why_not(self, aten_gm):
        return self._why_not_given(aten_gm, _forward_metadata())

    def _why_not_given(self, aten_gm, meta):
        if not self.eligible_inputs:
            return "inputs are not distinct plain tensors, or the graph lifts parameters"
        if self.autocast:
            return "autocast is enabled"
        placeholders = [n for n in aten_gm.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != self.num_inputs:
            return "aot_autograd changed the inputs"
        if meta is None:
            return "no aot_autograd metadata"
        try:
            problems = _wrapper_work(meta, _num_outputs(aten_gm))
        except AttributeError as error:  # a torch version with other metadata fields
            return f"unknown metadata ({error})"
        return "; ".join(problems) if problems else None


def _wrapper_work(meta, graph_outputs: int) -> list:
    """What aot_autograd's runtime wrapper would do for this graph (empty: nothing)."""
    from torch._functorch._aot_autograd.schemas import OutputType
    problems = []
    if meta.num_mutated_inp_runtime_indices or any(
            info.mutates_data or info.mutates_metadata for info in meta.input_info):
        problems.append("input mutation")
    if any(info.output_type != OutputType.non_alias for info in meta.output_info):
        problems.append("an output aliases an input or another output")
    if meta.num_intermediate_bases or meta.num_outputs != graph_outputs:
        problems.append("extra graph outputs")
    if meta.tokens:
        problems.append("effect tokens")
    if meta.grad_enabled_mutation is not None:
        problems.append("the graph changes grad mode")
    if meta.dynamic_outputs:
        problems.append("dynamic outputs")
    if meta.is_rng_op_functionalized:
        problems.append("functionalized RNG")
    return problems


def _direct_call(compiled, grad_enabled_at_compile: bool):
    if not grad_enabled_at_compile:        # Dynamo guards on grad mode: it is off at every call
        def run_inference(*args):
            return compiled(list(args))
    else:                                  # as aot_autograd does: no autograd graph inside
        def run_inference(*args):
            torch._C._set_grad_enabled(False)
            try:
                return compiled(list(args))
            finally:
                torch._C._set_grad_enabled(True)
    return run_inference


def _plain_distinct_tensors(inputs) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor
    plain = (torch.Tensor, torch.nn.Parameter)
    if not all(type(value) in plain or isinstance(value, FakeTensor) for value in inputs):
        return False
    return len({id(value) for value in inputs}) == len(inputs)


def _has_no_lifted_state(gm) -> bool:
    if not isinstance(gm, torch.fx.GraphModule):
        return False
    return next(gm.parameters(), None) is None and next(gm.buffers(), None) is None


def _any_autocast_enabled() -> bool:
    check = getattr(torch._C, "_is_any_autocast_enabled", None)
    return True if check is None else bool(check())


def _forward_metadata():
    context = torch._guards.TracingContext.try_get()
    return None if context is None else getattr(context, "fw_metadata", None)


def _num_outputs(gm) -> int:
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = output.args[0]
    return len(values) if isinstance(values, (tuple, list)) else 1
