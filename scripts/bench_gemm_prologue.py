"""GEMM prologue fusion on a GPU: each case compiled with config.gemm_prologue_fusion off
and cheap, the template forced (gemm_backends "triton") and chosen against cuBLAS
("aten,triton"), timed by triton.testing.do_bench (median ms), checked against eager.

    python scripts/bench_gemm_prologue.py [--shapes 4096x4096x4096,8192x1024x4096]

A prologue wins where the producer's kernel it saves costs more than what it adds to the
template's k loop (the producer's inputs loaded instead of the operand, its ops repeated
per tile column/row, the pipeline's stages cut where wider inputs fill shared memory).
Under "cheap" the compile times exactly that (gemm_choice.PrologueChoice): the template
computing the producer against the producer's own kernel plus the matmul without it. Each
compile's choices are printed below its row: the matmul's (template config, template,
aten, an elementwise pass) and the prologue's (fused or unfused, and the times it saw).
Every compile starts from an empty autotune cache, so each choice is measured.
"""
import argparse
import logging
import tempfile

import torch

CASES = {
    # float32 master weight cast to bf16 for the matmul (mixed precision without autocast)
    "x @ w.to(bf16)": (lambda x, w, s: x @ w.to(torch.bfloat16), torch.float32),
    # a per-input-feature scale of the activations (a norm's weight, a dequant scale)
    "(x * s) @ w": (lambda x, w, s: (x * s) @ w, torch.bfloat16),
    # both, with an epilogue
    "gelu((x * s) @ w.to(bf16))": (lambda x, w, s: torch.nn.functional.gelu((x * s) @ w.to(torch.bfloat16)),
                                   torch.float32),
}


class ChoiceLog(logging.Handler):
    """The max-autotune choice lines a compile logs (matmul and prologue)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        message = record.getMessage()
        if "max-autotune" in message or "prologue" in message:
            self.lines.append(message.removeprefix("tritonfuse: "))


def main():
    import triton.testing

    import tritonfuse
    from tritonfuse import config
    parser = argparse.ArgumentParser()
    parser.add_argument("--shapes", default="4096x4096x4096,8192x1024x4096", help="MxNxK,...")
    args = parser.parse_args()
    config.max_autotune = True
    choices = ChoiceLog()
    logger = logging.getLogger("tritonfuse")
    logger.addHandler(choices)
    logger.setLevel(logging.INFO)
    for shape in args.shapes.split(","):
        m, n, k = (int(v) for v in shape.split("x"))
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        s = torch.rand(k, device="cuda", dtype=torch.bfloat16) + 0.5
        for name, (fn, w_dtype) in CASES.items():
            w = torch.randn(k, n, device="cuda", dtype=w_dtype) / k ** 0.5
            expected = fn(x, w, s)
            row = [f"{shape} {name:28}", f"eager {triton.testing.do_bench(lambda: fn(x, w, s)):.3f}"]
            seen = []
            for backends in ("triton", "aten,triton"):
                for mode in ("off", "cheap"):
                    torch._dynamo.reset()
                    config.gemm_backends, config.gemm_prologue_fusion = backends, mode
                    config.autotune_cache_dir = tempfile.mkdtemp(prefix="bench_gemm_prologue_")
                    tritonfuse.metrics.reset()
                    choices.lines.clear()
                    compiled = torch.compile(fn, backend="tritonfuse")
                    torch.testing.assert_close(compiled(x, w, s), expected, atol=5e-2, rtol=5e-2)
                    ms = triton.testing.do_bench(lambda: compiled(x, w, s))
                    row.append(f"{backends}/{mode} {ms:.3f} ({tritonfuse.metrics.generated_kernel_count}k)")
                    seen += [f"    {backends}/{mode}: {line}" for line in choices.lines]
            print(" | ".join(row), flush=True)
            print("\n".join(seen), flush=True)


if __name__ == "__main__":
    main()
