"""Two vectors of rows per step for lanes-are-rows reductions (x - softmax(x) over a
strided dim). A mixin of CppKernel.

In the plain lanes-are-rows form each step of the row loop takes kVecLanes rows (8 floats
on AVX2: half a cache line of each reduced position) through every r loop. Its reads of
the input and its writes of an output laid out like the input then touch each line twice,
a whole reduced dim apart: at a power-of-two row stride (1024x1024 transposed) the lines
conflict in L1 and L2 before the second half comes, and a half-written output line is
read for ownership, evicted and read again. Here a step takes two vectors of rows: the
body is generated once, copied with its names renamed for the second vector (`tmp3` ->
`tmp3_b`, the lane base `x1` -> `x1_b`, local buffers and read caches get a second set),
and the two copies are interleaved inside each r loop, so each iteration reads and writes
whole lines. Kernel alone, one thread, x - softmax(x) f32 transposed: 1024x1024 2.04 ->
1.19 ms, 513x1531 1.04 -> 0.87 ms.

The jam is textual, so it accepts only bodies it can read: straight statements and
`for (...) {` blocks whose headers the rename leaves alone, every declared name renamed.
Anything else (masks, transposed output tiles, lambdas) keeps the one-vector form.
"""
import re
from typing import Optional

from tritonfuse import sym

from .common import cexpr

SECOND = "_b"   # suffix of the second vector's names
_LANE_NAMES = r"tmp\d+|acc\d+\w*|local_\w+|cache_\w+"
# a declaration: [alignas(n)] [const] type[*] [__restrict__] name followed by = ( [ or ;
_DECLARATION = re.compile(r"^\s*(?:alignas\(\d+\)\s+)?(?:const\s+)?[\w:<>]+\*?(?:\s+__restrict__)?\s+(\w+)\s*[=(\[;{]")
_FOR = re.compile(r"^\s*for \(.*\) \{$")


class CppLanePairs:
    def _lane_pairs_eligible(self) -> bool:
        """The plain lanes-are-rows form of a reduction with values kept across its loops
        (local buffers or read caches), static reduced sizes, no tiles."""
        return (self.axis == "x" and self.is_reduction and not self.tiled
                and bool(self.local_buffers or self.read_cache)
                and all(sym.is_static(s) for s in self.r_sizes))

    def _emit_lane_pair_loop(self, out, inner) -> bool:
        """The vector loop over the last x dim, two vectors per step; False (nothing
        written) when the body cannot be jammed."""
        var = f"x{len(self.x_sizes) - 1}"
        body = inner.getvalue()
        jammed = jam_two_vectors(body, var)
        if jammed is None:
            return False
        size = cexpr(self.x_sizes[-1])
        out.writeline(f"for (int64_t {var} = 0; {var} < {size}; {var} += 2 * tf::kVecLanes) {{")
        with out.indent():
            out.writeline(f"if ({var} + 2 * tf::kVecLanes <= {size}) {{   // two whole vectors of rows")
            with out.indent():
                out.writeline("constexpr bool TAIL = false;")
                out.writeline("(void)TAIL;")
                out.writeline("const int count = tf::kVecLanes;")
                out.writeline(f"const int64_t {var}{SECOND} = {var} + tf::kVecLanes;")
                for line in jammed:
                    out.writeline(line)
            out.writeline("} else {   // the last rows, a vector at a time")
            with out.indent():
                out.writeline(f"for (int64_t {var}_rest = {var}; {var}_rest < {size}; {var}_rest += tf::kVecLanes) {{")
                with out.indent():
                    out.writeline(f"const int64_t {var} = {var}_rest;")
                    self._emit_chunk(out, inner, f"{size} - {var} < tf::kVecLanes ? int({size} - {var}) : tf::kVecLanes")
                out.writeline("}")
            out.writeline("}")
        out.writeline("}")
        return True

    def _declare_second_vector_buffers(self, code, declared: str):
        """The second vector's local buffers and read caches: copies of the declarations."""
        for line in declared.splitlines():
            if line.strip():
                code.writeline(re.sub(rf"\b(local_\w+?|cache_\w+?)(_storage)?\b",
                                      lambda m: f"{m.group(1)}{SECOND}{m.group(2) or ''}", line.strip()))


def _rename(line: str, var: str) -> str:
    return re.sub(rf"\b({_LANE_NAMES}|{var})\b", lambda m: m.group(1) + SECOND, line)


def _blocks(lines):
    """Lines -> items: a statement (str) or a for block (header, [items]); None if a line
    is neither (an if, a lambda, a statement over several lines)."""
    stack = [[]]
    headers = []
    for line in lines:
        text = line.strip()
        if not text or text.startswith("//"):
            continue
        if _FOR.match(line):
            headers.append(text)
            stack.append([])
        elif text == "}":
            if not headers:
                return None
            items = stack.pop()
            stack[-1].append((headers.pop(), items))
        elif text.endswith(";") and "{" not in text and "}" not in text:
            stack[-1].append(text)
        else:
            return None
    return stack[0] if not headers else None


def _jam(first, second, out, depth):
    """Interleave two item lists of the same shape; False if their shapes differ."""
    if len(first) != len(second):
        return False
    statements = []
    for a, b in zip(first, second):
        if isinstance(a, str) != isinstance(b, str):
            return False
        if isinstance(a, str):
            statements.append((a, b))
            continue
        if a[0] != b[0]:   # a loop whose bounds depend on the lanes
            return False
        _flush(statements, out, depth)
        out.append("    " * depth + a[0])
        if not _jam(a[1], b[1], out, depth + 1):
            return False
        out.append("    " * depth + "}")
    _flush(statements, out, depth)
    return True


def _flush(statements, out, depth):
    out.extend("    " * depth + a for a, _ in statements)
    out.extend("    " * depth + b for _, b in statements)
    statements.clear()


def jam_two_vectors(body: str, var: str) -> Optional[list]:
    """The lines of ``body`` for two vectors of rows (lane base ``var`` and ``var``_b),
    interleaved inside each loop; None when the body has a construct this does not read
    or declares a name the rename would not give the second vector its own copy of."""
    lines = body.splitlines()
    for line in lines:
        declared = _DECLARATION.match(line)
        if declared and not re.fullmatch(_LANE_NAMES, declared.group(1)):
            return None
    first = _blocks(lines)
    second = _blocks([_rename(line, var) for line in lines])
    if first is None or second is None:
        return None
    out = []
    return out if _jam(first, second, out, 0) else None
