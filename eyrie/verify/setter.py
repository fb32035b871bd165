"""What a model class's ``set_eagle3_layers_to_capture`` does with the layer ids it is given.

The setter either writes ``layers_to_capture`` (maybe shifted: ``[i + 1 for i in ids]``, maybe a
default when no ids come) or passes the call on to a model it holds. Each way the ids can flow is
one `Transform`, each write or call one `Sink`, so the chain walk can follow the call and the
shift rule can be read off the cases.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from eyrie.verify.pyindex import ClassSym, Module
from eyrie.verify.syntax import (
    Cond,
    Evidence,
    assign_targets,
    evaluated_nodes,
    evidence,
    self_path,
    walk_branches,
)

SET = "set_eagle3_layers_to_capture"
FLAG = "capture_aux_hidden_states"
LAYERS = "layers_to_capture"
# Methods that write the capture list or mark layers (their own reads are not a capture).
SETTERS = {SET, "set_dflash_layers_to_capture", "set_dspark_layers_to_capture", "__init__"}


@dataclass
class Transform:
    """How a value relates to the method's id parameter: ids + add, a default, or unknown."""

    kind: str  # "ids" | "default" | "unknown" | "none"
    add: int = 0
    expr: str = ""
    conds: list[Cond] = field(default_factory=list)
    where: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, ast.expr] = field(default_factory=dict, repr=False)
    node: ast.expr | None = field(default=None, repr=False)


@dataclass
class Sink:
    """An action of ``set_eagle3_layers_to_capture``: write layers_to_capture, or pass it on."""

    kind: str  # "set" | "delegate"
    target: str  # attribute path under self ("" for self)
    transforms: list[Transform]
    conds: list[Cond]
    evidence: Evidence


@dataclass
class MethodInfo:
    """What one class's ``set_eagle3_layers_to_capture`` does."""

    owner: ClassSym
    param: str | None
    definition: Evidence
    sinks: list[Sink] = field(default_factory=list)
    flags: list[Evidence] = field(default_factory=list)
    guards: list[Evidence] = field(default_factory=list)
    raises: list[tuple[Evidence, list[Cond]]] = field(default_factory=list)
    locals: dict[str, ast.expr] = field(default_factory=dict, repr=False)


def is_none_test(cond: Cond, param: str | None) -> bool | None:
    """True when the condition holds exactly when no ids were given, False for the converse."""
    node = cond.node
    if param is None:
        return None
    positive = cond.positive
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        node, positive = node.operand, not positive
        if isinstance(node, ast.Name) and node.id == param:
            return not positive  # "not layer_ids" holds for None (and for an empty list)
    if (
        isinstance(node, ast.Compare)
        and isinstance(node.left, ast.Name)
        and node.left.id == param
        and len(node.ops) == 1
        and isinstance(node.comparators[0], ast.Constant)
        and node.comparators[0].value is None
    ):
        if isinstance(node.ops[0], ast.Is):
            return positive
        if isinstance(node.ops[0], ast.IsNot):
            return not positive
    return None


def analyze_method(mod: Module, owner: ClassSym, fn: ast.FunctionDef) -> MethodInfo:
    """Read one class's setter: its writes of the list, its calls passing it on, its raises."""
    args = [a.arg for a in fn.args.args[1:]]
    param = args[0] if args else None
    info = MethodInfo(owner, param, evidence(mod, fn, f"{owner.name}.{SET} defined"))
    local: dict[str, list[tuple[ast.expr, list[Cond], int]]] = {}
    for stmt in fn.body:  # early returns: "if not self.pp_group.is_last_rank: return"
        if (
            isinstance(stmt, ast.If)
            and not stmt.orelse
            and all(isinstance(s, ast.Return | ast.Pass) for s in stmt.body)
        ):
            info.guards.append(evidence(mod, stmt, "returns early"))
    for stmt, conds in walk_branches(fn.body, [], mod):
        for target, value in assign_targets(stmt):
            path = self_path(target) if isinstance(target, ast.Attribute) else None
            if isinstance(target, ast.Name):
                local.setdefault(target.id, []).append((value, conds, stmt.lineno))
                info.locals[target.id] = value
            elif path is not None and path.split(".")[-1] == LAYERS:
                tr = _transforms(mod, value, param, local, stmt.lineno)
                where = path.rpartition(".")[0]
                info.sinks.append(Sink("set", where, tr, conds, evidence(mod, stmt, f"{path} set")))
            elif path is not None and path.split(".")[-1] == FLAG:
                info.flags.append(evidence(mod, stmt, f"{path} set"))
        if isinstance(stmt, ast.Raise):
            info.raises.append((evidence(mod, stmt, "raises"), conds))
        for node in evaluated_nodes(stmt):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == SET
            ):
                target = self_path(node.func.value)
                if target is None or target == "":
                    continue
                arg = node.args[0] if node.args else None
                for kw in node.keywords:
                    if kw.arg in (None, param, "layer_ids", LAYERS):
                        arg = kw.value
                tr = (
                    _transforms(mod, arg, param, local, stmt.lineno)
                    if arg is not None
                    else [Transform("none", expr="(no ids: the callee's default)")]
                )
                ev = evidence(mod, stmt, f"passes the call to self.{target}")
                info.sinks.append(Sink("delegate", target, tr, conds, ev))
    return info


def _transforms(mod, value, param, local, lineno, depth=0) -> list[Transform]:
    """How ``value`` relates to the id parameter, one Transform per way it can be bound."""
    if depth > 4:
        return [Transform("unknown", expr=mod.segment(value), node=value)]
    if isinstance(value, ast.Name):
        out = []
        if value.id == param:
            out.append(Transform("ids", 0, expr=param, node=value))
        for bound, conds, line in local.get(value.id, []):
            if line < lineno:
                for tr in _transforms(mod, bound, param, local, line, depth + 1):
                    tr.conds = conds + tr.conds
                    out.append(tr)
        return out or [Transform("unknown", expr=value.id, node=value)]
    if (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id in ("list", "tuple")
        and len(value.args) == 1
    ):
        return _transforms(mod, value.args[0], param, local, lineno, depth + 1)
    if isinstance(value, ast.ListComp) and len(value.generators) == 1:
        gen = value.generators[0]
        add = _elt_shift(value.elt, gen.target)
        if not gen.ifs and add is not None:
            out = []
            for tr in _transforms(mod, gen.iter, param, local, lineno, depth + 1):
                if tr.kind == "ids":
                    tr.add += add
                elif tr.kind == "default":
                    tr = _default(mod, value, local, lineno, tr.conds)
                out.append(tr)
            return out
    names = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
    if param not in names and not any(
        _depends(n, param, local, lineno, 0) for n in names if n in local
    ):
        return [_default(mod, value, local, lineno, [])]
    return [Transform("unknown", expr=mod.segment(value), node=value)]


def _depends(name, param, local, lineno, depth) -> bool:
    if depth > 4:
        return True
    for bound, _, line in local.get(name, []):
        if line >= lineno:
            continue
        names = {n.id for n in ast.walk(bound) if isinstance(n, ast.Name)}
        if param in names or any(
            _depends(n, param, local, line, depth + 1) for n in names if n in local
        ):
            return True
    return False


def _default(mod, value, local, lineno, conds) -> Transform:
    """A value built without the ids (SGLang's default layers), with the locals it uses."""
    where, nodes, todo = {}, {}, [value]
    while todo:
        node = todo.pop()
        for name in sorted({n.id for n in ast.walk(node) if isinstance(n, ast.Name)}):
            bound = [b for b, _, line in local.get(name, []) if line < lineno]
            if bound and name not in where:
                where[name] = mod.segment(bound[-1])
                nodes[name] = bound[-1]
                todo.append(bound[-1])
    return Transform(
        "default",
        expr=mod.segment(value),
        conds=list(conds),
        where=where,
        nodes=nodes,
        node=value,
    )


def _elt_shift(elt: ast.expr, target: ast.expr) -> int | None:
    """k for ``v + k`` / ``k + v`` / ``v - k`` / ``v`` over the loop variable v."""
    if not isinstance(target, ast.Name):
        return None
    var = target.id
    if isinstance(elt, ast.Name) and elt.id == var:
        return 0
    if isinstance(elt, ast.BinOp) and isinstance(elt.op, ast.Add | ast.Sub):
        left, right = elt.left, elt.right
        if (
            isinstance(left, ast.Name)
            and left.id == var
            and isinstance(right, ast.Constant)
            and isinstance(right.value, int)
        ):
            return right.value if isinstance(elt.op, ast.Add) else -right.value
        if (
            isinstance(elt.op, ast.Add)
            and isinstance(right, ast.Name)
            and right.id == var
            and isinstance(left, ast.Constant)
            and isinstance(left.value, int)
        ):
            return left.value
    return None
