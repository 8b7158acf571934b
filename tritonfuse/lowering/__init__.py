"""aten -> IR lowerings. Importing this package registers every lowering."""
from . import (  # noqa: F401  (registration side effects)
    indexing, input_mutation, integer_math, layout, matmul, pointwise, pointwise_math, pooling, reductions, scan,
    scatter_views, tensor_ops, trilu_indices,
    views,
)
from .registry import Unsupported, lowerings

__all__ = ["Unsupported", "lowerings"]
