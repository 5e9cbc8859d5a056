"""The calculator tool's arithmetic: an expression's value from its syntax tree, never `eval`.
Numbers, + - * / // % **, parentheses, pi and e, and a few `math` functions; an exponent past
10,000 or a factorial past 1,000 is refused rather than left to the CPU limit."""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_FUNCTIONS = {
    name: getattr(math, name)
    for name in (
        "sqrt",
        "log",
        "log10",
        "log2",
        "exp",
        "sin",
        "cos",
        "tan",
        "floor",
        "ceil",
        "factorial",
        "gcd",
        "comb",
    )
}
_FUNCTIONS |= {"abs": abs, "round": round, "min": min, "max": max}
_NAMES = {"pi": math.pi, "e": math.e}


def _value(node: ast.AST) -> Any:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _value(node.left), _value(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 10_000:
            raise ValueError("exponent too large (more than 10000)")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_value(node.operand))
    if isinstance(node, ast.Name) and node.id in _NAMES:
        return _NAMES[node.id]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _FUNCTIONS
        and not node.keywords
    ):
        args = [_value(a) for a in node.args]
        if node.func.id == "factorial" and args and args[0] > 1000:
            raise ValueError("factorial argument too large (more than 1000)")
        return _FUNCTIONS[node.func.id](*args)
    raise ValueError(
        f"not allowed in an expression: {ast.unparse(node) if isinstance(node, ast.expr) else node!r}"
    )


def evaluate(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: arithmetic such as "(3 + 4) * 12 / 7" or "sqrt(2) ** 3"; +, -, *, /, //, %, **, pi, e and
            sqrt, log, exp, sin, cos, tan, floor, ceil, factorial, gcd, comb, abs, round, min, max.
    """
    tree = ast.parse(expression.strip(), mode="eval")
    value = _value(tree.body)
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)
