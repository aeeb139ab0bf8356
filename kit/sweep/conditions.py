"""A tiny, safe expression language for sweep constraints (``tp * pp > 8``), never ``eval``.

Only literals, the point's field names, arithmetic (``+ - * // % /``), comparisons (``== != < <=
> >= in``, chained) and ``and``/``or``/``not`` are allowed; anything else (calls, attributes,
subscripts, lambdas, powers) is refused when the sweep file loads.

A sweep file may come from another site, so the language is bounded: an expression is at most
:data:`MAX_TEXT` characters, arithmetic takes numbers only (no ``'x' * 20000000000``, no list
repetition or concatenation) and refuses a result beyond :data:`MAX_MAGNITUDE`.
"""

import ast
import operator
from collections.abc import Callable, Collection, Mapping
from typing import Any

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}
_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
    ast.Gt: operator.gt, ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {
    ast.Not: operator.not_, ast.USub: operator.neg,
}


MAX_TEXT = 500
"""Longest constraint, characters."""
MAX_MAGNITUDE = 2**63
"""Largest absolute value arithmetic may produce (a run field is never near it)."""


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _arithmetic(op: ast.operator, left: Any, right: Any) -> Any:
    """``left op right`` on numbers only, within :data:`MAX_MAGNITUDE`.

    Raises:
        ValueError: An operand that is not a number (string or list repetition), or a result
            beyond the bound.
    """
    if not (_number(left) and _number(right)):
        raise ValueError(f"arithmetic takes numbers, not {type(left).__name__} and "
                         f"{type(right).__name__}")
    result = _BINARY[type(op)](left, right)
    if abs(result) > MAX_MAGNITUDE:
        raise ValueError(f"a result beyond {MAX_MAGNITUDE}")
    return result


def parse_condition(text: str, names: Collection[str]) -> ast.Expression:
    """Parse ``text`` and check it uses only the allowed constructs and the given ``names``.

    Raises:
        ValueError: One line saying what is not allowed.
    """
    if len(text) > MAX_TEXT:
        raise ValueError(f"a constraint of {len(text)} characters: at most {MAX_TEXT}")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, RecursionError, MemoryError) as e:
        if not isinstance(e, SyntaxError):
            raise ValueError(f"{text!r} nests too deeply") from None
        raise ValueError(f"{text!r} is not an expression: {e.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ValueError(f"{text!r}: unknown field {node.id!r}")
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float, str, bool, type(None))):
                raise ValueError(f"{text!r}: literal {node.value!r} is not allowed")
            if _number(node.value) and abs(node.value) > MAX_MAGNITUDE:
                raise ValueError(f"{text!r}: a literal beyond {MAX_MAGNITUDE}")
        elif isinstance(node, ast.BinOp):
            for side in (node.left, node.right):
                if isinstance(side, (ast.Tuple, ast.List)) or (
                        isinstance(side, ast.Constant) and not _number(side.value)):
                    raise ValueError(f"{text!r}: arithmetic takes numbers, not "
                                     f"{ast.unparse(side)}")
        elif not isinstance(node, (
            ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.BinOp, ast.Compare,
            ast.Tuple, ast.List, ast.Load, *_BINARY, *_COMPARE, *_UNARY,
        )):
            raise ValueError(f"{text!r}: {type(node).__name__} is not allowed in a constraint")
    return tree


def evaluate_condition(tree: ast.Expression, fields: Mapping[str, Any]) -> Any:
    """Evaluate a tree from :func:`parse_condition` over one point's fields.

    Raises:
        ValueError: The expression fails on these values (e.g. ``None * 2``).
    """

    def ev(node: ast.AST) -> Any:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return fields[node.id]
        if isinstance(node, (ast.Tuple, ast.List)):
            return tuple(ev(e) for e in node.elts)
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](ev(node.operand))
        if isinstance(node, ast.BinOp):
            return _arithmetic(node.op, ev(node.left), ev(node.right))
        if isinstance(node, ast.BoolOp):
            values = (ev(v) for v in node.values)
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            for op, comparator in zip(node.ops, node.comparators, strict=True):
                right = ev(comparator)
                if not _COMPARE[type(op)](left, right):
                    return False
                left = right
            return True
        raise ValueError(f"{type(node).__name__} is not allowed in a constraint")

    try:
        return ev(tree)
    except (TypeError, ZeroDivisionError, OverflowError, RecursionError) as e:
        raise ValueError(str(e)) from None
