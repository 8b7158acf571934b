"""What generated code calls at run time: the Triton launcher and autotuner, the
launch-config heuristics, @triton.jit helpers, and wrapper helpers."""
