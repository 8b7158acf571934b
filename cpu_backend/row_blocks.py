"""Row blocks for kernels of several loops whose vector lanes are rows (an RMS norm, a
softmax over a strided reduced dim: ``x.t()`` normalized along its rows). A mixin of
CppKernel.

The plain lanes-are-rows form walks one vector of rows at a time down the whole reduced
dim, in every loop: each step reads kVecLanes elements from a different row of the input
(one page apart at 1024 floats), so the hardware prefetcher never helps and the second
loop reads the lines again after the first evicted them. Here the rows are taken in
blocks of B (contiguous in memory), and every loop walks the reduced dim once for the
whole block, reading B contiguous elements per step:

    for x_outer .., for each block of B rows (xb .. xb_end):     threads share the blocks
        acc_row[B] = identity                                     per reduction, in L1
        loop 1: for r ..: for x in block: acc_row[x - xb] op= f(in[r, x])
        (row-wise values computed once per block: blk_v[x - xb])
        loop 2: for r ..: for x in block: out[r, x] = g(in[r, x], acc_row[x - xb], blk_v[..])

B is chosen so that a block of the input (B x reduced elements) stays in L2 between the
loops. Values that cross from one part of the block to another go through block arrays
of B elements: reduction results (their accumulator rows), and the row-wise values that
do not depend on the reduced index (hoisted out of the r loops: an rsqrt per row, not
per element).
"""
import re

import sympy

from tritonfuse import sym
from tritonfuse.codegen.common import IndentedBuffer
from tritonfuse.dependencies import plan_and_deps, refine_dep

from . import common
from .common import HALF_TYPES, STORAGE_TYPES, _stride, cexpr, ctype
from .loop_nest import OUT_TILE_STEPS

# Bytes of one thread's block arrays (accumulator rows, row-wise values, output tiles):
# the widest block whose arrays stay near L1. Wide blocks matter most: each step of a loop
# then reads one long contiguous run, which the hardware prefetcher follows.
BLOCK_ARRAY_BYTES = 256 * 1024
BLOCK_REDUCTIONS = ("sum", "prod", "max", "min")

_DEFINITION = re.compile(r"^const auto (\w+) = (.*);$")
_NAME = re.compile(r"\b(tmp\d+|acc\d+_result|x\d+_lanes)\b")
_R_VAR = re.compile(r"\br\d+\b")
# An exp or log per element (softmax, log_softmax) keeps the plain form busy while its
# strided reads arrive: there the row blocks measured slower (log_softmax 1000x1000
# transposed 1.01x -> 0.84x Inductor, softmax 1024x1024 1.5x -> 1.1x), so such kernels
# keep the plain form; the norms' loops are loads and adds, and gain 1.5-4x.
_PER_ELEMENT_MATH = re.compile(r"\btf::(exp|expm1|log|log1p|log2)\(")
_STORABLE = {"float", "double"}   # vector values kept in block arrays; others are recomputed


class _Decline(Exception):
    """The generated loop bodies hold a construct the row-block form does not move."""


class CppRowBlocks:
    def _loop_row_blocks(self) -> bool:
        """Lanes are rows, two or more loops, reductions that combine lane-wise, no local
        buffers, stores contiguous across the rows or along the reduced dim."""
        if self.no_row_blocks or self.axis != "x" or not self.is_reduction:
            return False
        if not all(sym.is_static(s) for s in [*self.x_sizes, *self.r_sizes]):
            return False
        if self.local_buffers:
            # a value crossing loops (softmax's exp) would need a reduced row per row of the
            # block: narrow blocks, measured slower than the lane-interleaved local buffer
            # (softmax 1024x1024 transposed 1.5x -> 1.1x Inductor)
            return False
        if sum(seg.is_loop for seg in self.segments) < 2:
            return False
        x_last = sympy.Symbol(f"x{len(self.x_sizes) - 1}", integer=True, nonnegative=True)
        for seg in self.segments:
            for node, xs, rs, kind in seg.layouts:
                if kind == "reduction" and node.buffer.data.reduction_type not in BLOCK_REDUCTIONS:
                    return False
                if node.name in self.internal:
                    continue
                write = refine_dep(plan_and_deps(node.buffer, xs, rs)[2], self.x_sizes)
                if _stride(write.index, x_last) != 1 and not (kind == "xr" and self._tileable(node, write.index)):
                    return False
        return self._loop_block_width() is not None

    def _tileable(self, node, index) -> bool:
        """A store contiguous along the reduced dim (layer_norm of a transposed input, its
        output row-major): staged in a block tile, written out transposed."""
        r_last = sympy.Symbol(f"r{len(self.r_sizes) - 1}", integer=True, nonnegative=True)
        return STORAGE_TYPES[node.buffer.get_dtype()] in ("float", "uint16_t") and _stride(index, r_last) == 1

    def _loop_block_width(self, elements_per_row=1):
        """Rows per block: the block arrays (``elements_per_row`` 4-byte elements for each
        row of the block) within BLOCK_ARRAY_BYTES, whole vectors, enough blocks for the
        threads; None when there are not enough rows for the threads."""
        return self._row_block_width(self._row_block_threads(), BLOCK_ARRAY_BYTES // (4 * elements_per_row))

    def _row_block_threads(self) -> int:
        work = sym.hint(self.group.x_numel * self.group.r_numel)
        return self.num_threads if common.worth_threads(self.num_threads, work) else 1

    # ---- generation ---------------------------------------------------------------------
    def _generate_loop_row_blocks(self) -> str:
        threads = self._row_block_threads()
        self.block_width = "pending"       # chosen once the block arrays are known
        self.partials = []                 # accumulator rows (outer_reduction._rows_outer_reduction_op)
        self.emitted = {}                  # name -> CppVar of every value _emit wrote
        passes = []                        # [once lines, loop lines or None, out tiles of the loop]
        once = []
        for seg in self.segments:
            self.segment_index = seg.index
            self.vec_mode = True
            if not seg.is_loop:
                self.code, self.in_r_loop = IndentedBuffer(), False
                for layout in seg.layouts:
                    self._run_node(*layout)
                once += _lines(self.code)
                continue
            self.pre, self.post = IndentedBuffer(), IndentedBuffer()
            body = IndentedBuffer()
            self.out_tiles = {}
            try:
                self._run_loop_segment(seg, body)
                tiles = self.out_tiles
            finally:
                self.out_tiles = None
            if _lines(self.pre):
                raise _Decline("set-up code before a loop")
            passes.append([once, _lines(body), tiles])
            once = list(_lines(self.post))     # reduction results, stores of them
        if once:
            passes.append([once, None, {}])
        self.vec_mode = False
        scopes = _plan_scopes(passes, self.emitted, f"x{len(self.x_sizes) - 1}")
        if any(in_loop and any(_PER_ELEMENT_MATH.search(line) for line in lines) for lines, in_loop, _ in scopes.parts):
            raise _Decline("exp/log per element")
        tiles = max(len(part_tiles) for *_, part_tiles in scopes.parts)
        self.block_width = self._loop_block_width(len(self.partials) + len(scopes.transferred) + OUT_TILE_STEPS * tiles)
        if self.block_width is None:
            raise _Decline("too few rows for the threads")
        return self._emit_loop_row_blocks(scopes, threads)

    def _emit_loop_row_blocks(self, scopes, threads) -> str:
        k = len(self.x_sizes) - 1
        code = IndentedBuffer()
        code.writeline(f'extern "C" void {self.name}({self._params()}) {{')
        with code.indent():
            arrays = [(ctype(self.emitted[name].dtype), f"{name}_blk", 1) for name in scopes.transferred]
            # each loop numbers its tiles from 0 and uses them only inside its r steps: shared
            arrays += dict.fromkeys(("float", tile, OUT_TILE_STEPS) for *_, tiles in scopes.parts
                                    for tile, _, _ in tiles.values())
            opened, whole = self._open_row_blocks(code, threads, arrays)
            for lines, in_loop, tiles in scopes.parts:
                if all(_DEFINITION.match(line) for line in lines):
                    continue   # values only (reloads of results): nothing to run
                inner = IndentedBuffer()
                for line in lines:
                    inner.writeline(line)
                chunks = lambda inner=inner: self._emit_block_chunks(code, inner, k, whole)   # noqa: E731
                if in_loop and tiles:
                    self._emit_tiled_r_loops(code, chunks, tiles, whole)
                elif in_loop:
                    self._emit_r_loops(code, chunks)
                else:
                    chunks()
            self._close_blocks(code, opened)
        code.writeline("}")
        return code.getvalue()


    def _emit_tiled_r_loops(self, code, chunks, tiles, whole):
        """The r loops of a part that stores through block tiles: the innermost reduced dim
        in steps of OUT_TILE_STEPS, each step's tiles written out transposed after it."""
        last = len(self.r_sizes) - 1
        r, size = f"r{last}", cexpr(self.r_sizes[last])
        for i, outer in enumerate(self.r_sizes[:-1]):
            code.writeline(f"for (int64_t r{i} = 0; r{i} < {cexpr(outer)}; ++r{i}) {{")
            code._indent += 1
        code.writeline(f"for (int64_t {r}_block = 0; {r}_block < {size}; {r}_block += {OUT_TILE_STEPS}) {{")
        code._indent += 1
        code.writeline(f"const int64_t {r}_end = std::min<int64_t>({r}_block + {OUT_TILE_STEPS}, {size});")
        code.writeline(f"for (int64_t {r} = {r}_block; {r} < {r}_end; ++{r}) {{")
        code._indent += 1
        chunks()
        self._close_blocks(code, 1)
        writes = IndentedBuffer()
        r_var = sympy.Symbol(r, integer=True, nonnegative=True)
        block = sympy.Symbol(f"{r}_block", integer=True)
        for pointer, (tile, index, dtype) in tiles.items():
            writer = f"store_tile_transposed_{HALF_TYPES[dtype]}" if dtype in HALF_TYPES else "store_tile_transposed"
            writes.writeline(f"tf::{writer}({pointer} + {cexpr(index.xreplace({r_var: block}))}, "
                             f"{_stride(index, self.vector_var)}, {tile} + (x{len(self.x_sizes) - 1} - xb) * "
                             f"{OUT_TILE_STEPS}, int({r}_end - {r}_block), count);")
        self._emit_block_chunks(code, writes, len(self.x_sizes) - 1, whole)
        self._close_blocks(code, len(self.r_sizes))


def _lines(buffer: IndentedBuffer):
    return [line.strip() for line in buffer.getvalue().splitlines() if line.strip()]


class _Scopes:
    """The chunk bodies of a block in order: (lines, inside the r loops, out tiles)."""

    def __init__(self):
        self.parts = []
        self.transferred = []    # values kept in block arrays (NAME_blk)


def _plan_scopes(passes, emitted, x_last) -> _Scopes:
    """Split each pass into the part run once per block (its row-wise lines, and the lines
    of its loop that do not depend on the reduced index) and the part inside the r loops;
    then give every part the values it reads from other parts: reloaded from a block array
    (float vectors), recomputed from their definitions (scalars, other vectors), or
    reloaded from an accumulator row (reduction results)."""
    definitions = {}    # name -> (part index, expression line)
    raw_parts = []
    for once, loop, tiles in passes:
        hoisted, in_loop, r_dependent = [], [], set()
        for line in loop or []:
            if "{" in line or "}" in line:
                raise _Decline(f"a block in a loop body: {line}")
            match = _DEFINITION.match(line)
            names = set(_NAME.findall(line))
            if match and not _R_VAR.search(match.group(2)) and not (names & r_dependent) \
                    and not match.group(1).endswith("_result"):
                hoisted.append(line)
            else:
                in_loop.append(line)
                if match:
                    r_dependent.add(match.group(1))
        for line in once:
            if "{" in line or "}" in line:
                raise _Decline(f"a block in row-wise code: {line}")
        raw_parts.append((once + hoisted, False, {}))
        if loop is not None:
            raw_parts.append((in_loop, True, tiles))
    for index, (lines, _, _) in enumerate(raw_parts):
        for line in lines:
            match = _DEFINITION.match(line)
            if match:
                definitions[match.group(1)] = (index, line)
    scopes = _Scopes()
    stores = {}    # part index -> names it writes to block arrays
    for index, (lines, in_loop, tiles) in enumerate(raw_parts):
        local = {m.group(1) for m in map(_DEFINITION.match, lines) if m}
        prologue, seen = [], set(local)
        wanted = [n for line in lines for n in _NAME.findall(line) if n not in local]
        while wanted:
            name = wanted.pop()
            if name in seen:
                continue
            seen.add(name)
            if name not in definitions:
                raise _Decline(f"{name}: defined nowhere the block form sees")
            where, line = definitions[name]
            var = emitted.get(name)
            if name.endswith("_result"):     # a reduction result: its accumulator row
                prologue.append(line)
            elif var is not None and var.vec and ctype(var.dtype) in _STORABLE and not raw_parts[where][1]:
                if name not in scopes.transferred:
                    scopes.transferred.append(name)
                stores.setdefault(where, []).append(name)
                prologue.append(f"const auto {name} = tf::vload<TAIL>({name}_blk + ({x_last} - xb), count);")
            elif raw_parts[where][1] and where != index:
                raise _Decline(f"{name}: a value of another r loop")
            else:
                prologue.append(line)   # recomputed: its own inputs are wanted too
                wanted += [n for n in _NAME.findall(_DEFINITION.match(line).group(2)) if n not in seen]
        scopes.parts.append([_ordered(prologue, definitions) + lines, in_loop, tiles])
    for where, names in stores.items():
        scopes.parts[where][0] += [f"tf::vstore<TAIL>({n}_blk + ({x_last} - xb), {n}, count);"
                                   for n in dict.fromkeys(names)]
    return scopes


def _ordered(prologue, definitions):
    """The prologue lines in definition order (a recomputed value after its inputs)."""
    position = {line: i for i, (_, line) in enumerate(definitions.values())}
    return sorted(dict.fromkeys(prologue), key=lambda line: position.get(line, -1))
