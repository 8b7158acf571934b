"""Matmuls: mm, bmm and addmm.

A matmul runs as its aten call (cuBLAS, oneDNN/MKL) unless the compile is under
max-autotune (compile_options.py) and the backend of its device has a GEMM template
(``matmul_choice``; the C++ backend has none). Then the backend's choice step benchmarks
the template's configs against the aten call for the matmul's sizes, strides and dtype
(or finds the decision in the autotune cache): when the template wins, the matmul becomes
a ``TemplateBuffer`` and its pointwise consumers fuse into the template's store. addmm is
the template with its bias as such a consumer. When aten wins, or the template cannot take
the matmul (symbolic sizes, a dtype), the lowering declines and the op falls back, with
the reason logged.
"""
import torch

from .. import sym
from ..codegen.registry import matmul_choice
from ..ir import Layout, MatmulTemplate, StorageBox, TemplateBuffer, TensorBox
from ..virtualized import ops
from .registry import Unsupported, aten, expand, make_pointwise, register_lowering


def cuda_matmul_allows_tf32() -> bool:
    """Whether eager's float32 CUDA matmuls may use TF32: ``torch.backends.cuda.matmul.
    allow_tf32``, or the newer ``fp32_precision`` (torch refuses to read the one after
    the other was set)."""
    matmul = torch.backends.cuda.matmul
    try:
        return bool(matmul.allow_tf32)
    except RuntimeError:
        return getattr(matmul, "fp32_precision", "ieee") == "tf32"


def _fx_operands(first, second):
    from ..graph import current_graph
    args = current_graph().current_node.args
    return args[first], args[second]


@register_lowering(aten.mm)
def mm(a, b):
    return matmul_template(a, b, _fx_operands(0, 1), "mm")


@register_lowering(aten.bmm)
def bmm(a, b):
    return matmul_template(a, b, _fx_operands(0, 1), "bmm")


@register_lowering(aten.addmm)
def addmm(bias, a, b, *, beta=1, alpha=1):
    from ..graph import current_graph
    graph = current_graph()

    def addmm_call():
        return graph.strided_input(bias, graph.current_node.args[0]), beta, alpha
    product = matmul_template(a, b, _fx_operands(1, 2), "addmm", addmm_call)
    bias = expand(bias, product.get_size())

    def add_bias(bias_value, product_value):
        if beta != 1:
            bias_value = ops.mul(bias_value, ops.constant(beta, torch.float32))
        if alpha != 1:
            product_value = ops.mul(product_value, ops.constant(alpha, torch.float32))
        return ops.add(bias_value, product_value) if beta != 0 else product_value
    return make_pointwise(add_bias, [bias, product], torch.float32, product.get_dtype(), origin="addmm")


def matmul_template(a, b, fx_operands, origin, addmm_call=None) -> TensorBox:
    """The template's output for ``a @ b`` (2-d, or 3-d for bmm), or ``Unsupported``.
    ``addmm_call() -> (bias, beta, alpha)``: for an addmm, its bias as a buffer (realized
    only when the template is taken) and scales."""
    from ..graph import current_graph
    graph = current_graph()
    if not graph.options.max_autotune:
        raise Unsupported("matmuls run as aten calls (GEMM templates need mode='max-autotune')")
    device, dtype = a.get_device(), a.get_dtype()
    choice = matmul_choice(device.type)
    if choice is None:
        raise Unsupported(f"matmuls on {device.type} run as aten calls (its backend has no GEMM template)")
    if b.get_dtype() != dtype:
        raise Unsupported("operands of different dtypes")
    sizes = list(a.get_size()) + list(b.get_size())
    if not all(sym.is_static(s) for s in sizes):
        raise Unsupported("the GEMM template needs static sizes")
    *batch, m, k = (sym.to_int(s) for s in a.get_size())
    n = sym.to_int(b.get_size()[-1])
    batch = batch[0] if batch else 1
    if batch * m * n * k == 0:
        raise Unsupported("an empty matmul")
    why = choice.unsupported(dtype, batch)
    if why:
        raise Unsupported(why)
    operands = [graph.strided_input(value, fx_value) for value, fx_value in zip((a, b), fx_operands)]
    if not all(operand.layout.is_static() for operand in operands):
        raise Unsupported("the GEMM template needs static strides")
    batched = len(a.get_size()) == 3
    template = MatmulTemplate(device, dtype, *operands, batch=batch, m=m, n=n, k=k,
                              allow_tf32=device.type == "cuda" and cuda_matmul_allows_tf32(),
                              aten_op=aten.bmm.default if batched else aten.mm.default, origins=(origin,))
    layout = Layout.contiguous(device, dtype, ([batch] if batched else []) + [m, n])
    template.config, template.timings, why = choice.choose(template, layout)
    if template.config is None:
        raise Unsupported(why)
    if not template.timings.prefers_template(epilogue=True, output_stored=False):
        raise Unsupported(f"aten was faster than the GEMM template, even with an epilogue fused ({template.timings})")
    template.addmm = addmm_call() if addmm_call is not None else None
    buffer = TemplateBuffer(name=None, layout=layout, data=template)
    graph.register_buffer(buffer)
    return TensorBox(StorageBox(buffer))
