"""aten -> IR lowerings. Importing this package registers every lowering."""
from . import indexing, pointwise, reductions, scan, tensor_ops, views  # noqa: F401  (registration side effects)
from .registry import Unsupported, lowerings

__all__ = ["Unsupported", "lowerings"]
