"""Safe arithmetic for the ``calculator`` tool: an expression parsed with :mod:`ast`, never
``eval``'d, every node checked against a short list of what arithmetic needs, and every result
bounded (exponents, digits, the expression's length), so a model's input can neither run code
nor make the function spend its memory or its time on a number with a billion digits.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Final

#: the longest expression accepted (characters)
MAX_EXPRESSION_CHARS: Final = 500
#: the largest absolute exponent of ``**``
MAX_EXPONENT: Final = 1000
#: the most digits an integer result (or intermediate) may have
MAX_DIGITS: Final = 300

Number = int | float


class CalculatorError(ValueError):
    """The expression is not one this calculator evaluates; the message says why."""


_BINARY: Final[dict[type[ast.operator], Callable[[Number, Number], Number]]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: Final[dict[type[ast.unaryop], Callable[[Number], Number]]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_FUNCTIONS: Final[dict[str, Callable[..., Number]]] = {
    "abs": abs,
    "round": round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "log": math.log,
    "exp": math.exp,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "floor": math.floor,
    "ceil": math.ceil,
}
_CONSTANTS: Final[dict[str, float]] = {"pi": math.pi, "e": math.e}
_ALLOWED = (
    "numbers, + - * / // % **, parentheses, "
    + ", ".join(sorted(_CONSTANTS))
    + " and the functions "
    + ", ".join(sorted(_FUNCTIONS))
)


def evaluate(expression: str) -> Number:
    """The value of ``expression``, or :class:`CalculatorError` saying what is wrong."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalculatorError("expression must be a non-empty text such as '2 * (3 + 4)'")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(
            f"expression has {len(expression)} characters, more than {MAX_EXPRESSION_CHARS}: "
            "split the computation into several calls"
        )
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as error:
        raise CalculatorError(
            f"expression is not valid arithmetic ({error.msg}); allowed: {_ALLOWED}"
        ) from None
    try:
        value = _eval(tree.body)
    except ZeroDivisionError:
        raise CalculatorError("division by zero") from None
    except (OverflowError, ValueError) as error:
        if isinstance(error, CalculatorError):
            raise
        raise CalculatorError(f"math error: {error}") from None
    return _bounded(value)


def _bounded(value: Number) -> Number:
    if isinstance(value, bool):  # True/False are ints to Python, not numbers to the model
        raise CalculatorError("comparisons and booleans are not supported")
    if isinstance(value, int) and abs(value) >= 10**MAX_DIGITS:
        raise CalculatorError(f"a result has more than {MAX_DIGITS} digits")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalculatorError("the result is not a finite number")
    return value


def _too_many_digits(op: ast.operator, left: Number, right: Number) -> bool:
    """An integer power whose digits would pass the bound (checked before computing it)."""
    if not isinstance(op, ast.Pow) or not isinstance(left, int) or not isinstance(right, int):
        return False
    return right > 0 and abs(left) > 1 and right * math.log10(abs(left)) > MAX_DIGITS


def _eval(node: ast.AST) -> Number:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, int | float):
            raise CalculatorError(f"{node.value!r} is not a number; allowed: {_ALLOWED}")
        return _bounded(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise CalculatorError(f"exponent {right} is beyond +-{MAX_EXPONENT}")
        if _too_many_digits(node.op, left, right):
            raise CalculatorError(f"a result has more than {MAX_DIGITS} digits")
        return _bounded(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _bounded(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        raise CalculatorError(f"unknown name {node.id!r}; allowed: {_ALLOWED}")
    if isinstance(node, ast.Call):
        name = node.func.id if isinstance(node.func, ast.Name) else None
        if name not in _FUNCTIONS or node.keywords:
            raise CalculatorError(
                f"unknown function {ast.unparse(node.func)!r}; allowed: {_ALLOWED}"
            )
        if not node.args or len(node.args) > 10:
            raise CalculatorError(f"{name}() takes 1 to 10 arguments")
        try:
            return _bounded(_FUNCTIONS[name](*(_eval(arg) for arg in node.args)))
        except TypeError as error:
            raise CalculatorError(f"{name}(): {error}") from None
    raise CalculatorError(f"{ast.unparse(node)!r} is not supported; allowed: {_ALLOWED}")
