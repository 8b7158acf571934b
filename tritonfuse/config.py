"""Knobs of the compiler. Each reads its environment variable once at import; tests and
users may assign to them at run time (``tritonfuse.config.autotune = "max"``)."""
import os


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


# Which code generator serves CPU tensors: "cpp" (cpu_backend, OpenMP C++) or "triton"
# (the Triton backend run by Triton's interpreter).
cpu_backend: str = _env("TRITONFUSE_CPU_BACKEND", "cpp")

# Autotuning of Triton launch configs: "none" (first heuristic config), "default", "max".
autotune: str = _env("TRITONFUSE_AUTOTUNE", "default")

# Tune even under TRITON_INTERPRET (normally skipped: interpreted timings mean nothing).
autotune_under_interpreter: bool = _env("TRITONFUSE_AUTOTUNE_INTERPRET", "0") == "1"

# Write generated wrapper and kernels to a folder and print its path.
debug: bool = _env("TRITONFUSE_DEBUG", "0") == "1"

# Root of on-disk caches (compiled graphs, C++ builds). Autotune results have their own
# location (autotune_cache, TRITONFUSE_AUTOTUNE_CACHE_DIR).
cache_dir: str = _env(
    "TRITONFUSE_CACHE_DIR",
    os.path.join(os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "tritonfuse"),
)

# Reuse compiled graphs from the on-disk cache.
graph_cache: bool = _env("TRITONFUSE_GRAPH_CACHE", "1") == "1"

# Call inference graphs directly, without aot_autograd's runtime wrapper, when that wrapper
# would pass arguments and outputs through unchanged (see direct_inference.py).
direct_inference: bool = _env("TRITONFUSE_DIRECT_INFERENCE", "1") == "1"

# Replay compiled graphs from CUDA graphs (also mode="reduce-overhead" or
# options={"cudagraphs": True} in torch.compile); see runtime/cudagraphs.py.
cudagraphs: bool = _env("TRITONFUSE_CUDAGRAPHS", "0") == "1"

# Graphs with dynamic shapes get one static compile per input shape, up to this many;
# further shapes run eagerly.
max_shape_specializations: int = int(_env("TRITONFUSE_MAX_SHAPE_SPECIALIZATIONS", "8"))

# Fusion.
max_fusion_size: int = 64
# A pointwise value read by more users than this is realized instead of recomputed.
realize_reads_threshold: int = 4
# A pointwise body with more loads than this is realized when it is reused.
realize_loads_threshold: int = 8
