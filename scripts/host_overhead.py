"""Host time per call of a compiled model, with tiny tensors so that compute is negligible.

    python scripts/host_overhead.py --backend tritonfuse                 # static sizes
    python scripts/host_overhead.py --backend tritonfuse --dynamic 8,12,16
    python scripts/host_overhead.py --backend inductor --dynamic 8,12,16
    TRITONFUSE_CPU_BACKEND=triton python scripts/host_overhead.py --stub-launch --dynamic 8,12,16

Prints the wall time per step (us) of the training step (forward + backward) and of the
inference step, then a cProfile of the training steps (--top rows). With --dynamic the
step is compiled with dynamic=True, called once at each length, and timed at the last.

The host side of a compiled graph is the same code on CPU and GPU but for the launches.
With TRITONFUSE_CPU_BACKEND=triton, CPU tensors run Triton kernels in the interpreter,
which is slow; --stub-launch runs no kernel: every launch goes through the direct launch
that GPU kernels get (runtime/direct_launch.py) around a binary that does nothing, so that
the profile shows the GPU path's launcher layers (the results are garbage; arguments
that the first binary does not fit, which on a GPU get a binary of their own, launch nothing
at once).
"""
import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scripts import model_zoo as mz  # noqa: E402
import tritonfuse  # noqa: E402,F401


# --- --stub-launch: the GPU launch path around binaries that do nothing -------------------

class _NoBinary:
    """Stands in for a CompiledKernel: its launcher returns at once."""
    function = None
    packed_metadata = None

    @staticmethod
    def run(*args):
        return None


class _CpuDriver:
    """Stands in for Triton's active driver on a machine without a GPU."""

    @staticmethod
    def get_current_device():
        return 0

    @staticmethod
    def get_current_stream(device=None):
        return 0


def install_launch_stub() -> None:
    """Launchers of CPU tensors (TRITONFUSE_CPU_BACKEND=triton) launch through
    make_direct_launch around _NoBinary from their first launch on."""
    from triton.runtime.driver import driver
    from tritonfuse.runtime import async_compile, dynamic_launcher, triton_launcher
    from tritonfuse.runtime.direct_launch import make_direct_launch
    driver.set_active(_CpuDriver())

    def jit_function(launcher):
        return triton_launcher.load_kernel(launcher.name, launcher.source, tritonfuse.config.cache_dir)

    def stub_first_launch(self, args):
        """The first launch, but for running the kernel: the first candidate config."""
        self._load()
        self._candidates = self.candidates
        self.chosen_config = self._candidates[0]
        self._stub_argspec = async_compile.ArgSpec.of_args(args)
        if isinstance(self, dynamic_launcher._BucketLauncher):
            return   # its _sized() makes the later launches
        self.run = make_direct_launch(jit_function(self), _NoBinary(), self._stub_argspec, self.chosen_config,
                                      _NoBinary.run, self.grid(self.chosen_config)) or _NoBinary.run

    def stub_sized(self, cfg):
        return make_direct_launch(jit_function(self), _NoBinary(), self._stub_argspec, cfg, _NoBinary.run,
                                  self._grid(len(self._stub_argspec.args))) or _NoBinary.run

    triton_launcher.TritonLauncher._first_launch = stub_first_launch
    dynamic_launcher._BucketLauncher._sized = stub_sized


# --- the steps ----------------------------------------------------------------------------

def compiled_steps(model: str, backend: str, mode: str, lengths: list[int] | None, batch: int, length: int):
    """steps(n): n calls of the compiled step (with .backward() in "train" mode)."""
    spec = mz.text_model(model)
    dev = torch.device("cpu")
    step, _ = mz.make_step(spec, mode, dev, torch.float32)
    compiled = torch.compile(step, backend=backend, dynamic=True if lengths else None)
    for length in lengths or []:
        out = compiled(mz.make_batch(spec, mode, dev, torch.float32, batch=batch, length=length))
        if mode == "train":
            out.backward()
    inputs = mz.make_batch(spec, mode, dev, torch.float32, batch=batch, length=lengths[-1] if lengths else length)

    def steps(n: int) -> None:
        for _ in range(n):
            out = compiled(inputs)
            if mode == "train":
                out.backward()
            else:
                del out
    if mode == "infer":
        step.requires_grad_(False)
    return steps


def us_per_step(steps, n: int, repeats: int = 5) -> tuple[float, float]:
    """(wall, CPU) us per step, each the best of `repeats` timings of n steps. The CPU
    time is this thread's (compute runs in it: one intra-op thread), which a shared
    machine's other processes disturb less than the wall time."""
    steps(3)
    wall = cpu = float("inf")
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.thread_time()
        steps(n)
        wall = min(wall, (time.perf_counter() - start) / n)
        cpu = min(cpu, (time.thread_time() - start_cpu) / n)
    return wall * 1e6, cpu * 1e6


def profile(steps, n: int, top: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    steps(n)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-gqa")
    parser.add_argument("--backend", default="tritonfuse", choices=["tritonfuse", "inductor", "eager"])
    parser.add_argument("--dynamic", default="", help="comma-separated lengths: dynamic=True, timed at the last")
    parser.add_argument("--length", type=int, default=16, help="the static step's length")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--top", type=int, default=25, help="cProfile rows (0: no profile)")
    parser.add_argument("--modes", default="train,infer")
    parser.add_argument("--stub-launch", action="store_true",
                        help="Triton launches on CPU through the GPU's direct launch around a no-op binary")
    args = parser.parse_args(argv)
    if args.stub_launch:
        install_launch_stub()
    torch.set_num_threads(1)
    lengths = [int(v) for v in args.dynamic.split(",") if v] or None
    what = f"{args.model} {args.backend} cpu_backend={tritonfuse.config.cpu_backend} " \
           f"{'dynamic ' + args.dynamic if lengths else 'static'}{' stub-launch' if args.stub_launch else ''}"
    for mode in args.modes.split(","):
        steps = compiled_steps(args.model, args.backend, mode, lengths, args.batch, args.length)
        wall, cpu = us_per_step(steps, args.steps)
        from tritonfuse import metrics
        print(f"== {what} {mode}: {wall:.0f} us/step wall, {cpu:.0f} us/step CPU (best of 5 x {args.steps}); "
              "tritonfuse so far: "
              f"{metrics.symbolic_graphs} symbolic graphs, {metrics.static_specializations} per-shape compiles, "
              f"{metrics.eager_graphs} eager graphs", flush=True)
        if args.top and mode == "train":
            print(profile(steps, args.steps, args.top))


if __name__ == "__main__":
    main()
