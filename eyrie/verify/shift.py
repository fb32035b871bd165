"""The layer-id shift rule of a release: how the ids given to set_eagle3_layers_to_capture
become the ``layers_to_capture`` that the base model's forward reads.

SGLang records the *input* of layer j when j is in ``layers_to_capture``, which is the output of
layer j - 1. Eyrie's aux id i means the output of layer i, so the export stage needs
``layers_to_capture == [i + 1 for i in aux_ids]`` and must know which ids to pass to get it.
Releases differ (some add 1 to every id, some only when the first id is 1), so the rule is read
from the source as ordered cases, and the cases' conditions are evaluated here by a small
interpreter that only knows lists of ints, comparisons and the layer count.
"""

from __future__ import annotations

import ast
import itertools
import operator
from dataclasses import dataclass, field

from eyrie.common.errors import EyrieError


class ShiftError(EyrieError, ValueError):
    """The rule cannot be applied to these ids; the message says why."""


@dataclass
class Case:
    """One branch: ``layers_to_capture = [i + add for i in ids]`` when every condition holds."""

    add: int | None  # None: the value is not derived from the ids given
    when: list[str]
    expr: str
    file: str = ""
    line: int = 0
    text: str = ""
    cond_nodes: list = field(default_factory=list, repr=False)

    def describe(self) -> str:
        if self.add is None:
            act = f"replaces the ids by {self.expr}"
        elif self.add == 0:
            act = "keeps the ids as given"
        else:
            act = f"adds {self.add} to every id"
        return f"{act} when {' and '.join(self.when)}" if self.when else act


@dataclass
class Step:
    """The cases of one class's set_eagle3_layers_to_capture (one step per delegation level)."""

    cls: str
    param: str
    cases: list[Case]
    locals: dict[str, ast.expr] = field(default_factory=dict, repr=False)

    def unconditional(self) -> int | None:
        if len(self.cases) == 1 and not self.cases[0].when:
            return self.cases[0].add
        return None

    def describe(self) -> str:
        if not self.cases:
            return f"{self.cls}: ids given are not used"
        parts, earlier = [], set()
        for case in self.cases:
            # "otherwise" already says "not (an earlier condition)"
            when = [w for w in case.when if not (w.startswith("not (") and w[5:-1] in earlier)]
            parts.append(Case(case.add, when, case.expr).describe())
            earlier.update(case.when)
        return f"{self.cls}: " + "; otherwise ".join(parts)


@dataclass
class ShiftRule:
    steps: list[Step]

    def total(self) -> int | None:
        """The shift when every step is unconditional, else None."""
        adds = [s.unconditional() for s in self.steps]
        if not adds or any(a is None for a in adds):
            return None
        return sum(adds)

    def kind(self) -> str:
        if not self.steps:
            return "none"
        total = self.total()
        if total is not None:
            return f"always+{total}" if total >= 0 else f"always{total}"
        if any(c.add is None for s in self.steps for c in s.cases):
            return "unknown"
        return "conditional"

    def summary(self) -> str:
        if not self.steps:
            return "no ids reach layers_to_capture"
        total = self.total()
        if total is not None:
            head = "keeps every id as given" if total == 0 else f"adds {total} to every id"
            if len(self.steps) > 1:
                head += " (" + ", then ".join(s.describe() for s in self.steps) + ")"
            return head
        return "; then ".join(s.describe() for s in self.steps)

    def apply(self, ids: list[int], num_layers: int | None = None) -> list[int]:
        """The layers_to_capture that these ids produce, following the rule case by case."""
        values = list(ids)
        for step in self.steps:
            for case in step.cases:
                env = {step.param: values}
                if all(
                    bool(_eval(n, env, step.locals, num_layers)) == pos
                    for n, pos in case.cond_nodes
                ):
                    if case.add is None:
                        raise ShiftError(
                            f"{step.cls} replaces the given ids by {case.expr} "
                            f"({case.file}:{case.line})"
                        )
                    values = [v + case.add for v in values]
                    break
            else:
                raise ShiftError(f"no branch of {step.cls}.set_eagle3_layers_to_capture applies")
        return values

    def ids_for(self, aux_ids: list[int], num_layers: int | None = None) -> list[int]:
        """The ids to pass so that layers_to_capture == [i + 1 for i in aux_ids]."""
        want = [i + 1 for i in aux_ids]
        adds = [sorted({c.add for c in s.cases if c.add is not None}) for s in self.steps]
        totals = sorted({sum(combo) for combo in itertools.product(*adds)}, reverse=True)
        errors = []
        for total in totals:
            guess = [w - total for w in want]
            try:
                if self.apply(guess, num_layers) == want:
                    return guess
            except ShiftError as exc:
                errors.append(str(exc))
        if errors and len(errors) == len(totals):
            raise ShiftError(f"cannot work out the ids to pass: {errors[0]}")
        raise ShiftError(
            f"no ids make this release capture the outputs of layers {aux_ids} "
            f"(layers_to_capture {want}); its rule: {self.summary()}. "
            "Choose other capture.aux_layer_ids"
        )

    def to_json(self) -> dict:
        return {
            "kind": self.kind(),
            "summary": self.summary(),
            "steps": [
                {
                    "class": s.cls,
                    "param": s.param,
                    "cases": [
                        {
                            "add": c.add,
                            "when": c.when,
                            "expr": c.expr,
                            "file": c.file,
                            "line": c.line,
                            "text": c.text,
                        }
                        for c in s.cases
                    ],
                }
                for s in self.steps
            ],
        }


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_CMPOPS = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
}
_CALLS = {"len": len, "max": max, "min": min, "list": list, "sorted": sorted, "tuple": list}


def evaluate(node: ast.expr, env: dict, local: dict[str, ast.expr], num_layers: int | None):
    """Evaluate a source expression over ids and the layer count; ShiftError on anything else."""
    return _eval(node, env, local, num_layers)


def _eval(node, env, local, num_layers, depth=0):
    if depth > 20:
        raise ShiftError("expression too deep to evaluate")
    ev = lambda n: _eval(n, env, local, num_layers, depth + 1)  # noqa: E731
    if isinstance(node, ast.Constant) and isinstance(node.value, int | bool | type(None)):
        return node.value
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        if node.id in local:
            return ev(local[node.id])
        raise ShiftError(f"cannot evaluate name {node.id!r}")
    if isinstance(node, ast.Attribute) and node.attr == "num_hidden_layers":
        if num_layers is None:
            raise ShiftError("the rule depends on num_hidden_layers, which is not known here")
        return num_layers
    if isinstance(node, ast.List | ast.Tuple):
        return [ev(e) for e in node.elts]
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        return _BINOPS[type(node.op)](ev(node.left), ev(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not ev(node.operand)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -ev(node.operand)
    if isinstance(node, ast.BoolOp):
        value = None
        for part in node.values:
            value = ev(part)
            if isinstance(node.op, ast.And) and not value:
                return value
            if isinstance(node.op, ast.Or) and value:
                return value
        return value
    if isinstance(node, ast.Compare) and all(type(op) in _CMPOPS for op in node.ops):
        left = ev(node.left)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = ev(right_node)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.Subscript) and not isinstance(node.slice, ast.Slice):
        return ev(node.value)[ev(node.slice)]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _CALLS
        and len(node.args) == 1
        and not node.keywords
    ):
        return _CALLS[node.func.id](ev(node.args[0]))
    if isinstance(node, ast.ListComp) and len(node.generators) == 1:
        gen = node.generators[0]
        if isinstance(gen.target, ast.Name) and not gen.ifs:
            out = []
            for item in ev(gen.iter):
                inner = {**env, gen.target.id: item}
                out.append(_eval(node.elt, inner, local, num_layers, depth + 1))
            return out
    raise ShiftError(f"cannot evaluate {ast.unparse(node)!r}")
