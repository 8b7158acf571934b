"""Scatters into a view that are pointwise: each output element knows from its own index
whether the view covers it, and where in ``src`` its value is.

    diagonal_scatter(self, src, offset, dim1, dim2)
        out[..., a, ..., b, ...] = src[..., a - max(-offset, 0)]  where b - a == offset
                                 = self[...]                      elsewhere

(slice_scatter and select_scatter arrive decomposed; as_strided_scatter is an index_put,
extra_decompositions.py.)
"""
import sympy
import torch

from .. import sym
from ..ir import Pointwise, TensorBox, origins_of
from ..virtualized import ops
from .registry import SUPPORTED_DTYPES, Unsupported, aten, normalize_dim, register_lowering


@register_lowering(aten.diagonal_scatter)
def diagonal_scatter(self, src, offset=0, dim1=0, dim2=1):
    dtype = self.get_dtype()
    if dtype not in SUPPORTED_DTYPES or src.get_dtype() not in SUPPORTED_DTYPES:
        raise Unsupported(f"diagonal_scatter of {dtype}")
    ndim = len(self.get_size())
    dim1, dim2 = normalize_dim(dim1, ndim), normalize_dim(dim2, ndim)
    if dim1 == dim2:
        raise Unsupported("diagonal_scatter with dim1 == dim2")
    first_row = sympy.Integer(max(-offset, 0))
    load_self, load_src = self.make_loader(), src.make_loader()

    def inner_fn(index):
        row, col = index[dim1], index[dim2]
        on_diagonal = ops.eq(ops.index_expr(col - row, torch.int64), ops.constant(offset, torch.int64))
        src_index = [i for d, i in enumerate(index) if d not in (dim1, dim2)] + [row - first_row]

        def read_src():
            value = load_src(src_index)
            return value if src.get_dtype() == dtype else ops.to_dtype(value, dtype)
        return ops.where(on_diagonal, ops.masked(on_diagonal, read_src, 0), load_self(index))

    origins = tuple(dict.fromkeys(origins_of([self, src]) + ("diagonal_scatter",)))
    return TensorBox.create(Pointwise(self.get_device(), dtype, inner_fn, sym.sizes_of(self.get_size()),
                                      origins=origins))
