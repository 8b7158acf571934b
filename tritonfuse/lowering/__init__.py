"""aten -> IR lowerings. Importing this package registers every lowering."""
from . import (  # noqa: F401  (registration side effects)
    indexing, input_mutation, layout, matmul, pointwise, pointwise_math, pooling, reductions, scan, scatter_views, tensor_ops,
    views,
)
from .registry import Unsupported, lowerings

__all__ = ["Unsupported", "lowerings"]
