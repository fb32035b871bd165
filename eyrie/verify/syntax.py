"""Reading Python syntax trees with citations: the pieces every static check of the source uses.

A finding is worth only as much as its citation, so each one is an `Evidence` (file, line, the
line's text). The walkers here visit the statements of a function with the conditions each one
sits under, so a check can tell an unconditional write from one inside an ``if``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from eyrie.verify.pyindex import Module


@dataclass
class Evidence:
    """One cited source line: what it shows, where it is, and its text (stripped)."""

    what: str
    file: str
    line: int
    text: str


def evidence(mod: Module, node: ast.AST, what: str) -> Evidence:
    return Evidence(what, mod.rel, node.lineno, mod.line(node.lineno))


@dataclass
class Cond:
    """A condition an action sits under; ``positive`` is False in the else branch."""

    text: str
    positive: bool
    node: ast.expr = field(repr=False, compare=False)

    def describe(self) -> str:
        return self.text if self.positive else f"not ({self.text})"


def self_path(node: ast.expr) -> str | None:
    """The path "a.b" for ``self.a.b``, "" for ``self``, None when not rooted at self."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "self":
        return ".".join(reversed(parts))
    return None


def attr_call(node: ast.AST, funcs: tuple[str, ...], nargs) -> ast.Constant | None:
    """The literal name of ``getattr``/``hasattr``/``setattr(x, "NAME", ...)``: a call of one of
    `funcs` with a count of arguments in `nargs` and a constant second one; None otherwise."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in funcs
        and len(node.args) in nargs
        and isinstance(node.args[1], ast.Constant)
    ):
        return node.args[1]
    return None


def is_hasattr(node: ast.AST, name: str | None = None) -> bool:
    """Whether a node is ``hasattr(x, "...")`` with a literal name (that `name`, when given)."""
    found = attr_call(node, ("hasattr",), (2,))
    return found is not None and (name is None or found.value == name)


def join_path(path: str, attr: str) -> str:
    """Attribute paths joined with a dot, either side may be empty ("" is ``self``)."""
    return f"{path}.{attr}" if path and attr else path or attr


def walk_branches(stmts: list[ast.stmt], conds: list[Cond], mod: Module):
    """Yield (simple statement, enclosing conditions), descending into compound statements."""
    for stmt in stmts:
        if isinstance(stmt, ast.If):
            text = mod.segment(stmt.test)
            yield stmt, conds
            yield from walk_branches(stmt.body, [*conds, Cond(text, True, stmt.test)], mod)
            yield from walk_branches(stmt.orelse, [*conds, Cond(text, False, stmt.test)], mod)
        elif isinstance(stmt, ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith):
            yield stmt, conds
            yield from walk_branches(stmt.body, conds, mod)
            yield from walk_branches(getattr(stmt, "orelse", []), conds, mod)
        elif isinstance(stmt, ast.Try):
            yield from walk_branches(stmt.body, conds, mod)
            for handler in stmt.handlers:
                yield from walk_branches(handler.body, conds, mod)
            yield from walk_branches(stmt.orelse + stmt.finalbody, conds, mod)
        elif isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        else:
            yield stmt, conds


def _header_nodes(stmt: ast.stmt) -> list[ast.AST]:
    """The expressions a compound statement evaluates itself (its test, its iterable)."""
    if isinstance(stmt, ast.If | ast.While):
        return [stmt.test]
    if isinstance(stmt, ast.For | ast.AsyncFor):
        return [stmt.iter]
    if isinstance(stmt, ast.With | ast.AsyncWith):
        return [item.context_expr for item in stmt.items]
    return [stmt]


def evaluated_nodes(stmt: ast.stmt):
    """Every node a statement evaluates itself (for a compound one, its header only)."""
    for top in _header_nodes(stmt):
        yield from ast.walk(top)


def assign_targets(stmt: ast.stmt) -> list[tuple[ast.expr, ast.expr]]:
    if isinstance(stmt, ast.Assign):
        return [(t, stmt.value) for t in stmt.targets]
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        return [(stmt.target, stmt.value)]
    return []
