"""Upsampling (nearest, nearest-exact, bilinear; torch.nn.functional.interpolate).

No upsample op reaches a lowering: torch registers Python decompositions of every
upsample_nearest{1,2,3}d / _upsample_nearest_exact{1,2,3}d / upsample_bilinear2d overload
at the Autograd dispatch key (torch/_decomp/decompositions.py, ``py_impl``), so tracing
rewrites them, before any backend sees the graph, into ``_unsafe_index`` reads at index
vectors computed from ``arange`` with eager's float arithmetic (and, for bilinear, the
interpolation weights as pointwise math). The backward is ``_unsafe_index_put`` with
accumulation, i.e. index_put (lowered with the other scatters).

``_unsafe_index`` is index.Tensor without the bounds check: the same indexed read. Its
index vectors stay unrealized, so an upsample is one kernel that computes its source
indices and reads them, fused with what follows.
"""
from .registry import aten, register_lowering
from .tensor_ops import index

register_lowering(aten._unsafe_index)(index)
