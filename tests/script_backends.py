"""Dynamo backends that fail the way a compiler can fail a benchmark worker, for
tests/test_scripts.py: the model suites get them as ``--backends
tests.script_backends:crash`` and run them in their worker processes."""
import os
import time


def crash(gm, example_inputs):
    """Ends its process at once, as a segfault in a compiler would (SIGABRT)."""
    os.abort()


def hang(gm, example_inputs):
    """Never returns, as a compile stuck for good."""
    while True:
        time.sleep(60)
