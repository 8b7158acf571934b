"""The choice step of max-autotune: for one matmul, the GEMM template's configs against the
aten call (cuBLAS on GPUs), measured at compile time.

Every candidate runs the plain template (its output stored, no epilogue) or the aten op on
random operands with the matmul's sizes, strides and dtype, and one elementwise pass over
the output is timed too: what fusing an epilogue into the template saves (the product's
write and read, and a launch). The template is kept where it beats aten plus that saving
(``MatmulTimings``); whether an epilogue did fuse is known after scheduling, where the
final decision is made (gemm_template.py). Measurements go through the autotune cache
(key: the plain kernel's source, the candidates, the device and the versions), so a later
compile of the same matmul, in any process, benchmarks nothing. ``config.gemm_backends``
says whether aten may win. Nothing is benchmarked under ``config.autotune == "none"``,
nor under Triton's interpreter (its timings mean nothing; unless
``config.autotune_under_interpreter``): the template's heuristic config is used.

Prologues (config.gemm_prologue_fusion) are decided after scheduling too, by timing the
kernel they change: the template computing the producers in its loads against the
producers' own kernels plus the matmul without them (``choose_prologue``,
``PrologueChoice``); the plain template's time cannot say what they add to its k loop.
"""
import functools
import logging
from dataclasses import dataclass
from typing import Optional

import torch

from ... import config as tf_config
from ...runtime import autotuner
from ...runtime.gemm_heuristics import mm_configs
from ...runtime.heuristics import MAX_GRID_YZ, Config
from .gemm_template import plain_source

log = logging.getLogger("tritonfuse")

# The plain kernel's name: one name for every matmul, so that equal problems give equal
# sources (and autotune cache keys) whatever graph they come from.
PLAIN_KERNEL_NAME = "triton_tem_mm"
ROUND_TRIP = "round trip"      # the timing of one elementwise pass over the output
# The prologue choice's kernel and the names of what it compares (PrologueChoice).
PROLOGUE_KERNEL_NAME = "triton_tem_mm_prologue"
FUSED = "template with prologue"
PRODUCERS = "producer kernels"
MATMUL = "matmul without prologue"
ZERO_DIVISION = "zero_division"   # a kernel run's int32 flag of an integer division by zero


@dataclass(frozen=True)
class AtenCall:
    """The aten op as a candidate of the choice (in the autotune cache key's candidates: a
    config with no blocks and no warps of ours; its timing is kept as "aten")."""

    def __str__(self):
        return "aten"

    def to_dict(self):
        return {"kwargs": {}, "num_warps": 0, "num_stages": 0}


ATEN = AtenCall()


@dataclass(frozen=True)
class MatmulTimings:
    """What the choice step measured for one matmul, in ms (None: not measured): the best
    template config, the aten call, and one elementwise pass over the output."""
    template_ms: Optional[float] = None
    aten_ms: Optional[float] = None
    round_trip_ms: Optional[float] = None
    cached: bool = False

    def prefers_template(self, epilogue: bool, output_stored: bool) -> bool:
        """Whether the template beats aten followed (with an epilogue) by the epilogue's own
        kernel. Fusing saves that kernel's round trip over the product, or only its read
        of it when the product is stored anyway (another kernel reads it)."""
        if self.template_ms is None or self.aten_ms is None:
            return True
        return self.template_ms < self.aten_ms + self._epilogue_saved(epilogue, output_stored)

    def matmul_ms(self, epilogue: bool, output_stored: bool) -> Optional[float]:
        """The matmul as ``prefers_template`` runs it (None: not measured): the template's
        time, or aten's plus the epilogue kernel that the template would have saved. An
        epilogue fused into the template counts as free, as in the plain template timed."""
        if self.template_ms is None or self.aten_ms is None:
            return self.template_ms
        return min(self.template_ms, self.aten_ms + self._epilogue_saved(epilogue, output_stored))

    def _epilogue_saved(self, epilogue, output_stored) -> float:
        round_trip = self.round_trip_ms or 0.0
        return 0.0 if not epilogue else round_trip / (2 if output_stored else 1)

    def __str__(self):
        if self.template_ms is None:
            return "not benchmarked"
        return (f"template {_ms(self.template_ms)}, aten {_ms(self.aten_ms)}, an elementwise pass over the "
                f"output {_ms(self.round_trip_ms)}" + (", from the autotune cache" if self.cached else ""))


@dataclass(frozen=True)
class KernelRun:
    """One kernel that the prologue choice times: what its launcher is made of, the
    buffers its run takes (by name, in signature order; ZERO_DIVISION: an int32 flag),
    then its integer arguments."""
    name: str
    source: str
    kind: str
    numels: dict
    configs: tuple
    mutated: tuple
    buffers: tuple
    scalars: tuple = ()


@dataclass(frozen=True)
class PrologueChoice:
    """Whether a template keeps the prologues that the scheduler fused into it, and the
    times (ms; None: not measured) that decided it:

        fused_ms                 the template computing the producers in its operand loads
                                 (the kernel the graph runs, storing its output plainly as the
                                 template timed by ``choose`` does: the epilogue counts in
                                 neither)
        producers_ms + matmul_ms the producers' own kernels (the operands written to memory),
                                 then the matmul without prologues as the choice runs it
                                 (``MatmulTimings.matmul_ms``: template, or aten plus the
                                 epilogue kernel)

    kept where fused_ms is the smaller; ``why``: a reason given instead of times."""
    keep: bool
    fused_ms: Optional[float] = None
    producers_ms: Optional[float] = None
    matmul_ms: Optional[float] = None
    cached: bool = False
    why: str = ""

    @staticmethod
    def compare(fused_ms, producers_ms, matmul_ms, cached=False) -> "PrologueChoice":
        return PrologueChoice(fused_ms < producers_ms + matmul_ms, fused_ms, producers_ms, matmul_ms, cached)

    def __str__(self):
        verdict = "fused" if self.keep else "unfused"
        if self.fused_ms is None:
            return f"{verdict}: {self.why}"
        return (f"{verdict}: the template computing it in its loads {_ms(self.fused_ms)} against its producers' "
                f"kernels {_ms(self.producers_ms)} + the matmul without it {_ms(self.matmul_ms)}"
                + (", from the autotune cache" if self.cached else ""))


class MatmulChoice:
    """The GEMM template of one Triton backend: which matmuls it takes, its best config for
    each and how that compares with aten."""

    def __init__(self, env, device_type, dtypes, use_libdevice):
        self.env = env
        self.device_type = device_type       # where the launcher runs kernels ("cpu": interpreted)
        self.dtypes = dtypes
        self.use_libdevice = use_libdevice

    def unsupported(self, dtype, batch) -> str:
        """Why the template cannot compute this matmul ("" when it can)."""
        if "triton" not in _allowed_backends():
            return "config.gemm_backends excludes the GEMM template (triton)"
        if dtype not in self.dtypes:
            return f"the GEMM template here takes {', '.join(str(d).replace('torch.', '') for d in self.dtypes)}, " \
                   f"not {str(dtype).replace('torch.', '')}"
        if batch > MAX_GRID_YZ:
            return f"a batch of {batch} exceeds the {MAX_GRID_YZ} programs of grid axis 1"
        return ""

    def choose(self, template, output_layout):
        """(the template's best config, its ``MatmulTimings``, a note): config None when no
        config of the template runs here (the note says why)."""
        candidates = mm_configs(template.batch, template.m, template.n, template.k, template.dtype.itemsize,
                                min_programs=self._min_programs(template.device),
                                shared_memory=self.shared_memory(template.device),
                                tensor_cores=template.dtype != torch.float32 or template.allow_tf32)
        if not candidates:
            return None, MatmulTimings(), "no GEMM template config fits this device"
        choices = list(candidates) + ([ATEN] if "aten" in _allowed_backends() else [])
        if len(choices) == 1 or tf_config.autotune == "none" or \
                (self.device_type == "cpu" and not tf_config.autotune_under_interpreter):
            return self._chosen(template, candidates[0], MatmulTimings())
        import autotune_cache
        source = plain_source(self.env, PLAIN_KERNEL_NAME, template, output_layout, self.use_libdevice)
        device, versions = self._device_name(template.device), autotune_cache.current_versions()
        key = autotune_cache.make_key(source, [c.to_dict() for c in choices], device, versions)
        cache = autotune_cache.AutotuneCache()
        entry = cache.get(key)
        best = next((c for c in candidates if entry is not None and c.to_dict() == entry["config"]
                     and str(c) in entry["timings_ms"]), None)
        cached = best is not None
        if cached:
            autotuner.stats.cache_hits += 1
            timings = entry["timings_ms"]
        else:
            best, timings = self._benchmark(template, output_layout, source, choices)
            if best is None:
                return None, MatmulTimings(), "every GEMM template config failed to run"
            self._store(cache, key, source, template, best, timings, choices, device, versions)
        return self._chosen(template, best, MatmulTimings(timings[str(best)], timings.get(str(ATEN)),
                                                          timings.get(ROUND_TRIP), cached=cached))

    @staticmethod
    def _chosen(template, config, timings):
        log.info("tritonfuse: max-autotune: mm %s: GEMM template %s (%s)", _shape(template), config, timings)
        return config, timings, ""

    # ---- benchmarking -----------------------------------------------------------------
    def _benchmark(self, template, output_layout, source, choices):
        """(the fastest template config or None, {choice: ms} with the round trip) on real
        random operands: outside the fake-tensor mode that the compile runs in."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily
        with unset_fake_temporarily():
            return self._benchmark_real(template, output_layout, source, choices)

    def _benchmark_real(self, template, output_layout, source, choices):
        from ...runtime.triton_launcher import TritonLauncher
        storages, views, out = _random_operands(template, output_layout)
        args = list(storages) + [out]
        numels = {"b": template.batch, "m": template.m, "n": template.n}
        compiled = {}
        if self.device_type == "cuda":   # every config compiles at once in the pool, before the first is timed
            compiled = dict(pointer_dtypes=tuple(t.dtype for t in args), device_index=_index(out.device),
                            example_scalars=())
        launchers = {choice: TritonLauncher(PLAIN_KERNEL_NAME, source, "template", numels, [len(args) - 1],
                                            self.device_type, configs=[choice], **compiled)
                     for choice in choices if choice is not ATEN}
        aten_op = torch.bmm if len(output_layout.size) == 3 else torch.mm

        def launch(choice):
            if choice is ATEN:
                aten_op(*views)
                return
            launchers[choice].run(*args)
        try:
            _, timings = autotuner.select_best(choices, launch, args, [], name=f"mm {_shape(template)}")
        except autotuner.AutotuneError as error:
            log.warning("tritonfuse: %s", error)
            return None, {}
        ran = [c for c in choices if isinstance(c, Config) and str(c) in timings]
        if not ran:
            return None, timings
        scratch = torch.empty_like(out)
        timings[ROUND_TRIP] = autotuner.benchmark(lambda: torch.neg(out, out=scratch), device_type=out.device.type)
        return min(ran, key=lambda c: timings[str(c)]), timings

    def _store(self, cache, key, source, template, best, timings, choices, device, versions):
        import autotune_cache
        self._put(cache, key, {"kernel_name": f"mm {_shape(template)}", "config": best.to_dict(), "device": device,
                               "versions": versions, "timings_ms": timings,
                               "source_sha256": autotune_cache.source_hash(source),
                               "candidates": [c.to_dict() for c in choices], "kind": "gemm"})

    @staticmethod
    def _put(cache, key, entry):
        try:
            cache.put(key, entry)
        except OSError as error:
            log.warning("tritonfuse: could not write the autotune cache: %s", error)

    # ---- prologues ----------------------------------------------------------------------
    def choose_prologue(self, template, fused, producers, buffers, matmul_ms) -> PrologueChoice:
        """Whether ``template`` keeps its prologues: the ``fused`` KernelRun (the template
        computing them) timed against the ``producers`` KernelRuns plus ``matmul_ms``
        (PrologueChoice says what is compared). ``buffers``: {name: (elements of storage,
        dtype)} of every buffer the runs take. The decision and its times go into the
        autotune cache, keyed by the kernels' sources (so by the prologues), the fused
        kernel's config and the matmul's time without them: a matmul measured again
        measures its prologues again."""
        import autotune_cache
        device, versions = self._device_name(template.device), autotune_cache.current_versions()
        source = "\n".join([fused.source] + [run.source for run in producers])
        candidates = [fused.configs[0].to_dict(), {MATMUL: matmul_ms}]
        key = autotune_cache.make_key(source, candidates, device, versions)
        cache = autotune_cache.AutotuneCache()
        entry = cache.get(key)
        if entry is not None and entry.get("prologue") in ("fused", "unfused") and \
                {FUSED, PRODUCERS} <= set(entry["timings_ms"]):
            autotuner.stats.cache_hits += 1
            timings = entry["timings_ms"]
            choice = PrologueChoice(entry["prologue"] == "fused", timings[FUSED], timings[PRODUCERS], matmul_ms,
                                    cached=True)
        else:
            times = self._time_runs([fused] + list(producers), buffers, template.device)
            if times is None:
                choice = PrologueChoice(False, why="a kernel of the choice failed to run")
            else:
                autotuner.stats.tuned += 1
                choice = PrologueChoice.compare(times[0], sum(times[1:]), matmul_ms)
                self._put(cache, key, {
                    "kernel_name": f"mm {_shape(template)} prologue", "config": candidates[0], "device": device,
                    "versions": versions, "source_sha256": autotune_cache.source_hash(source),
                    "candidates": candidates, "kind": "gemm prologue",
                    "prologue": "fused" if choice.keep else "unfused",
                    "timings_ms": {FUSED: choice.fused_ms, PRODUCERS: choice.producers_ms, MATMUL: matmul_ms}})
        log.info("tritonfuse: max-autotune: mm %s: prologue %s", _shape(template), choice)
        return choice

    def _time_runs(self, runs, buffers, device):
        """[ms of each of ``runs``] on random buffers (outside the compile's fake-tensor
        mode), or None where one fails to run."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        from ...runtime.triton_launcher import TritonLauncher
        with unset_fake_temporarily():
            storages = {name: _random_storage(numel, dtype, device) for name, (numel, dtype) in buffers.items()}
            storages[ZERO_DIVISION] = torch.zeros(1, dtype=torch.int32, device=device)
            times = []
            for run in runs:
                tensors = [storages[name] for name in run.buffers]
                compiled = {}
                if self.device_type == "cuda":
                    compiled = dict(pointer_dtypes=tuple(t.dtype for t in tensors), device_index=_index(device),
                                    example_scalars=run.scalars)
                launcher = TritonLauncher(run.name, run.source, run.kind, run.numels, run.mutated, self.device_type,
                                          configs=list(run.configs), **compiled)
                launch = functools.partial(launcher.run, *tensors, *run.scalars)
                try:
                    launch()     # compiles it (and picks a producer kernel's launch config)
                    times.append(autotuner.benchmark(launch, device_type=device.type))
                except Exception as error:    # a compile or launch failure: the choice cannot run it
                    log.warning("tritonfuse: the prologue choice could not run %s: %s", run.name, error)
                    return None
            return times

    # ---- the device ---------------------------------------------------------------------
    def _min_programs(self, device) -> int:
        """Programs that keep the device busy: one per multiprocessor (8 when interpreted)."""
        if self.device_type == "cpu":
            return 8
        return _device_properties(_index(device))[0]

    def shared_memory(self, device):
        """Bytes of shared memory a program may use on ``device`` (None: interpreted, no limit)."""
        if self.device_type == "cpu":
            return None
        return _device_properties(_index(device))[1]

    def _device_name(self, device) -> str:
        if self.device_type == "cpu":
            return "cpu (triton interpreter)"
        return torch.cuda.get_device_name(_index(device))


def _allowed_backends() -> set:
    return {name.strip().lower() for name in tf_config.gemm_backends.split(",")}


def _index(device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


@functools.lru_cache(None)
def _device_properties(index):
    """(multiprocessors, shared memory bytes a program may opt in to) of a CUDA device."""
    props = torch.cuda.get_device_properties(index)
    shared = getattr(props, "shared_memory_per_block_optin", None)
    if shared is None:      # a torch without the field: ask Triton's driver
        from triton.runtime import driver
        shared = driver.active.utils.get_device_properties(index)["max_shared_mem"]
    return props.multi_processor_count, int(shared)


def _random_operands(template, output_layout):
    """(storage tensors, the operand views over them, the output) for a benchmark: one
    storage per operand buffer (``x @ x.t()`` reads one), sized for every view of it."""
    operands = list(zip(template.operand_names, (template.a, template.b)))
    sizes = {}
    for name, value in operands:
        sizes[name] = max(sizes.get(name, 0), int(value.layout.storage_size()))
    storages = {name: torch.randn(size, device=template.device).to(template.dtype) for name, size in sizes.items()}
    views = [torch.as_strided(storages[name], _ints(v.layout.size), _ints(v.layout.stride), int(v.layout.offset))
             for name, v in operands]
    out = torch.empty_strided(_ints(output_layout.size), _ints(output_layout.stride), dtype=template.dtype,
                              device=template.device)
    return list(storages.values()), views, out


def _random_storage(numel, dtype, device):
    """A flat buffer of ``numel`` random elements of ``dtype`` (small integers, or bools)."""
    if dtype == torch.bool:
        return torch.rand(numel, device=device) < 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(numel, device=device).to(dtype)
    low = 0 if dtype == torch.uint8 else -8
    return torch.randint(low, 8, (numel,), device=device, dtype=dtype)


def _ints(values):
    return tuple(int(v) for v in values)


def _shape(template) -> str:
    """"8x512x64 @ 8x64x512 bfloat16": the operands' shapes."""
    batch = f"{template.batch}x" if template.batch > 1 else ""
    return f"{batch}{template.m}x{template.k} @ {batch}{template.k}x{template.n} {str(template.dtype).replace('torch.', '')}"


def _ms(value) -> str:
    return "-" if value is None else f"{value:.4f} ms"
