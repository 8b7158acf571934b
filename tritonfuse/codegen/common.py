"""Building blocks shared by the code generators: an indented code buffer, a CSE that
names each distinct expression once, kernel-argument naming, and a sympy printer that
backends specialize only where their syntax differs."""
import contextlib
from dataclasses import dataclass

import torch
from sympy.printing.str import StrPrinter

from ..sym import FloorDiv, ModularIndexing

# Backends render a kernel under this name first, so that kernels identical but for the
# name compare equal (the wrapper then defines them once); `name_kernel` names it.
KERNEL_NAME_PLACEHOLDER = "KERNEL_NAME"


def name_kernel(template: str, name: str) -> str:
    """The kernel source `template`, rendered as KERNEL_NAME_PLACEHOLDER, called `name`."""
    return template.replace(KERNEL_NAME_PLACEHOLDER, name)


class IndentedBuffer:
    def __init__(self, indent: int = 0):
        self.lines = []
        self._indent = indent

    def writeline(self, line: str = ""):
        self.lines.append(("    " * self._indent + line) if line else "")

    def splice(self, other: "IndentedBuffer | str"):
        text = other.getvalue() if isinstance(other, IndentedBuffer) else other
        for line in text.splitlines():
            self.writeline(line)

    @contextlib.contextmanager
    def indent(self, by: int = 1):
        self._indent += by
        try:
            yield
        finally:
            self._indent -= by

    def getvalue(self) -> str:
        return "\n".join(self.lines) + ("\n" if self.lines else "")

    def __bool__(self):
        return bool(self.lines)


@dataclass(eq=False)
class CSEVariable:
    """A named value in generated code. ``dtype`` is the logical torch dtype; ``shape``
    tells backends that care whether the value varies over x only or over x and r."""
    name: str
    dtype: torch.dtype
    over_r: bool = False

    def __str__(self):
        return self.name


class CSE:
    """Common-subexpression elimination: each distinct expression string gets one name."""

    def __init__(self, prefix: str = "tmp"):
        self.prefix = prefix
        self.cache = {}
        self.counter = 0

    def generate(self, buffer: IndentedBuffer, expr: str, dtype, over_r=False, write=None) -> CSEVariable:
        if expr in self.cache:
            return self.cache[expr]
        var = self.new_var(dtype, over_r)
        (write or (lambda v, e: buffer.writeline(f"{v} = {e}")))(var, expr)
        self.cache[expr] = var
        return var

    def new_var(self, dtype, over_r=False) -> CSEVariable:
        var = CSEVariable(f"{self.prefix}{self.counter}", dtype, over_r)
        self.counter += 1
        return var

class KernelArgs:
    """Maps buffer names to kernel parameter names: in_ptr0.. (read), out_ptr0.. (written),
    in_out_ptr0.. (an output written in place over an input that dies in this kernel: one
    pointer, read and written, passed as the output's name).

    ``in_place``: {output buffer: the input buffer whose memory it takes} (memory_planning)."""

    def __init__(self, in_place=None):
        self.inputs = {}
        self.outputs = {}
        self.in_outs = {}     # output buffer -> parameter
        self.in_place = dict(in_place or {})
        self._over = {source: output for output, source in self.in_place.items()}

    def input(self, name: str) -> str:
        if name in self._over or name in self.in_place:
            return self._in_out(self._over.get(name, name))
        if name in self.outputs:
            return self.outputs[name]
        if name not in self.inputs:
            self.inputs[name] = f"in_ptr{len(self.inputs)}"
        return self.inputs[name]

    def output(self, name: str) -> str:
        if name in self.in_place:
            return self._in_out(name)
        if name not in self.outputs:
            self.outputs[name] = f"out_ptr{len(self.outputs)}"
        return self.outputs[name]

    def _in_out(self, output: str) -> str:
        if output not in self.in_outs:
            self.in_outs[output] = f"in_out_ptr{len(self.in_outs)}"
        return self.in_outs[output]

    def call_order(self):
        """[(parameter name, buffer name)] in signature order: in_out, in, out."""
        return [(p, b) for b, p in self.in_outs.items()] + [(p, b) for b, p in self.inputs.items()] + \
            [(p, b) for b, p in self.outputs.items()]

    def written_positions(self):
        """Positions in ``call_order`` of the parameters the kernel writes."""
        written = len(self.in_outs) + len(self.inputs)
        return list(range(len(self.in_outs))) + list(range(written, written + len(self.outputs)))


class UnprintableExpression(ValueError):
    """A size or index expression that generated code cannot compute exactly (a function
    of Dynamo's that no printer knows, a fraction in integer code). Raised while generating
    code, so that the graph compiles another way (per shape), never when it runs."""


class IndexPrinter(StrPrinter):
    """Prints index expressions by precedence. Backends override ``_print_FloorDiv`` and
    ``_print_ModularIndexing`` (Triton ``//``, C ``/``). Any other function, and a
    fraction (integer code would truncate it), raises ``UnprintableExpression``: sympy's
    default would print a call of an undefined name, or ``1/3``."""

    floordiv_op = "//"

    def _print_FloorDiv(self, expr):
        base, divisor = expr.args
        return f"({self.paren(base)} {self.floordiv_op} {self.paren(divisor)})"

    def _print_ModularIndexing(self, expr):
        base, divisor, modulus = expr.args
        inner = self.paren(base) if divisor == 1 else f"({self.paren(base)} {self.floordiv_op} {self.paren(divisor)})"
        return f"({inner} % {self.paren(modulus)})"

    def paren(self, expr):
        text = self._print(expr)
        return text if (expr.is_Symbol or expr.is_Integer or isinstance(expr, (FloorDiv, ModularIndexing))) \
            else f"({text})"

    def _print_Integer(self, expr):
        return str(int(expr))

    def _print_Symbol(self, expr):
        return expr.name

    def _print_Pow(self, expr):
        base, exp = expr.args
        if exp.is_Integer and int(exp) > 0:
            return "*".join([self.paren(base)] * int(exp))
        raise ValueError(f"cannot print {expr} as an index")

    def _print_Min(self, expr):
        return self._nary("min", expr.args)

    def _print_Max(self, expr):
        return self._nary("max", expr.args)

    min_function = "min"
    max_function = "max"

    def _print_Function(self, expr):
        raise UnprintableExpression(f"no code for {type(expr).__name__} in {expr}")

    def _print_Rational(self, expr):
        raise UnprintableExpression(f"a fraction ({expr}) in integer code")

    def _nary(self, kind, args):
        function = self.min_function if kind == "min" else self.max_function
        text = self._print(args[0])
        for arg in args[1:]:
            text = f"{function}({text}, {self._print(arg)})"
        return text


class PythonPrinter(IndexPrinter):
    """Sizes and scalars in the generated host code (Python)."""

    def _print_Float(self, expr):
        return repr(float(expr))

    def _print_Rational(self, expr):
        return f"({expr.p} / {expr.q})"


_python_printer = PythonPrinter()


def pexpr(expr) -> str:
    """A size expression as Python source (the symbols are variables of the wrapper)."""
    return _python_printer.doprint(expr)
