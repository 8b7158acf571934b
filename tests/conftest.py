"""The device matrix: every behavioural test takes the ``device`` fixture and runs once
per entry this machine has.

    cpu               CPU tensors, kernels from cpu_backend (OpenMP C++)
    triton-interpret  CPU tensors, Triton kernels run by Triton's interpreter
    cuda              GPU tensors, compiled Triton kernels (only where a GPU is present)
"""
import os
import sys
import zlib

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import tritonfuse  # noqa: E402
from tritonfuse import config, metrics  # noqa: E402


def _cpp_backend_available():
    try:
        import cpu_backend  # noqa: F401
        from cpu_backend.build import find_compiler
        find_compiler()
        from tritonfuse.codegen.registry import _backends
        return "cpu" in _backends
    except Exception:
        return False


DEVICE_MATRIX = []
if _cpp_backend_available():
    DEVICE_MATRIX.append(("cpu", "cpu", "cpp"))
DEVICE_MATRIX.append(("triton-interpret", "cpu", "triton"))
if torch.cuda.is_available():
    DEVICE_MATRIX.append(("cuda", "cuda", None))

_only = os.environ.get("TRITONFUSE_TEST_DEVICES")
if _only:
    DEVICE_MATRIX = [entry for entry in DEVICE_MATRIX if entry[0] in _only.split(",")]


@pytest.fixture(params=[entry[1:] for entry in DEVICE_MATRIX], ids=[entry[0] for entry in DEVICE_MATRIX])
def device(request, monkeypatch):
    device_type, cpu_backend = request.param
    if cpu_backend is not None:
        monkeypatch.setattr(config, "cpu_backend", cpu_backend)
    return device_type


@pytest.fixture(autouse=True)
def _fresh_state(request, tmp_path_factory, monkeypatch):
    """Each test starts with fresh dynamo caches and metrics, its own graph cache, and a
    random seed of its own: a failure reproduces, whatever ran before it or beside it."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    base = tmp_path_factory.getbasetemp()
    monkeypatch.setattr(config, "cache_dir", str(base / "tritonfuse_cache"))
    monkeypatch.setattr(config, "autotune_cache_dir", str(base / "autotune_cache"))
    torch._dynamo.reset()
    metrics.reset()
    yield
    torch._dynamo.reset()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: a worker per core, at most four. Each worker compiles (g++, Triton) and
    runs OpenMP kernels on every core, so more workers only contend."""
    return max(1, min(4, os.cpu_count() or 1))
