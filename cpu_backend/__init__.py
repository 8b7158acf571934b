"""The OpenMP C++ backend of tritonfuse. Importing it registers it for "cpu" tensors;
it plugs in through the device registry alone."""
from tritonfuse import register_backend_for_device

from .scheduling import CppScheduling

register_backend_for_device("cpu", CppScheduling)
