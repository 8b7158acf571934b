"""The one virtual ``ops`` handler.

Lowering writes loop bodies as closures that call ``ops.add(a, b)``, ``ops.load(buf, idx)``,
... without knowing who listens. Analysis passes install a recording handler; code
generators install a handler that emits code and returns variable names.
"""
import contextlib


class _OpsProxy:
    def __init__(self):
        self._handler = None

    def __getattr__(self, name):
        handler = self.__dict__["_handler"]
        if handler is None:
            raise RuntimeError(f"ops.{name} called with no ops handler installed")
        return getattr(handler, name)


ops = _OpsProxy()


@contextlib.contextmanager
def set_ops_handler(handler):
    previous = ops.__dict__["_handler"]
    ops.__dict__["_handler"] = handler
    try:
        yield handler
    finally:
        ops.__dict__["_handler"] = previous
