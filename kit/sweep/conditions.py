"""A tiny, safe expression language for sweep constraints (``tp * pp > 8``), never ``eval``.

Only literals, the point's field names, arithmetic (``+ - * // % /``), comparisons (``== != < <=
> >= in``, chained) and ``and``/``or``/``not`` are allowed; anything else (calls, attributes,
subscripts, lambdas) is refused when the sweep file loads.
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


def parse_condition(text: str, names: Collection[str]) -> ast.Expression:
    """Parse ``text`` and check it uses only the allowed constructs and the given ``names``.

    Raises:
        ValueError: One line saying what is not allowed.
    """
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise ValueError(f"{text!r} is not an expression: {e.msg}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ValueError(f"{text!r}: unknown field {node.id!r}")
        elif isinstance(node, ast.Constant):
            if not isinstance(node.value, (int, float, str, bool, type(None))):
                raise ValueError(f"{text!r}: literal {node.value!r} is not allowed")
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
            return _BINARY[type(node.op)](ev(node.left), ev(node.right))
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
    except (TypeError, ZeroDivisionError) as e:
        raise ValueError(str(e)) from None
