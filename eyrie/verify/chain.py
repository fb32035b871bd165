"""Walk a model class of SGLang, statically, to see whether aux-hidden-state capture reaches it.

SGLang turns EAGLE-3 capture on by calling ``model.set_eagle3_layers_to_capture(ids)`` on the
top-level model class. That method usually sets ``self.capture_aux_hidden_states`` and writes
``self.model.layers_to_capture``, which the base model's ``forward`` reads; wrapper classes
(vision-language models and the like) must pass the call on to their language model. This module
follows that path through inheritance and composition (``self.x = SomeModel(...)`` in
``__init__``) and records every step as ``file:line`` evidence, without importing anything.
What one setter does is read by eyrie.verify.setter and what a class holds by
eyrie.verify.compose; this module joins the two into a verdict and the chain's shift rule.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from eyrie.verify.compose import Binding, Composition
from eyrie.verify.findings import layer_uses
from eyrie.verify.pyindex import ClassSym, SourceIndex
from eyrie.verify.setter import (
    LAYERS,
    SET,
    MethodInfo,
    Sink,
    Transform,
    analyze_method,
    is_none_test,
)
from eyrie.verify.shift import Case, ShiftRule, Step
from eyrie.verify.syntax import Cond, Evidence, evidence, is_hasattr, join_path, self_path


@dataclass
class Reach:
    """Whether capture, switched on at one class, reaches a forward that reads it."""

    ok: bool
    reason: str
    path: list[tuple[str, ClassSym]] = field(default_factory=list)  # delegation levels
    owner: tuple[str, ClassSym] | None = None  # class that writes layers_to_capture
    holder: tuple[str, ClassSym] | None = None  # class whose forward reads it
    steps: list[Step] = field(default_factory=list)
    default_ids: list[Transform] = field(default_factory=list)
    unresolved: list[str] = field(default_factory=list)


class ChainAnalyzer(Composition):
    """Static questions about one release's model classes, answered once and cached."""

    def __init__(self, index: SourceIndex):
        super().__init__(index)
        self._method: dict[ClassSym, MethodInfo | None] = {}
        self._reach: dict[ClassSym, Reach] = {}

    # -- basic lookups ------------------------------------------------------------------------

    def class_evidence(self, sym: ClassSym) -> Evidence:
        mod, node = self.index.class_node(sym)
        return evidence(mod, node, f"class {sym.name}")

    def method_evidence(self, sym: ClassSym, name: str) -> tuple[ClassSym, Evidence] | None:
        found = self.index.lookup(sym, name)
        if found is None:
            return None
        owner, fn = found
        return owner, evidence(self.module_of(owner), fn, f"{owner.name}.{name} defined")

    # -- what set_eagle3_layers_to_capture does ----------------------------------------------

    def method_info(self, sym: ClassSym) -> MethodInfo | None:
        found = self.index.lookup(sym, SET)
        if found is None:
            return None
        owner, fn = found
        if owner not in self._method:
            self._method[owner] = analyze_method(self.module_of(owner), owner, fn)
        return self._method[owner]

    # -- static truth of structural conditions -----------------------------------------------

    def _static(self, sym: ClassSym, cond: Cond) -> bool | None:
        """Decide ``hasattr(self.x, "name")`` from the classes behind self.x; None if unknown."""
        node, positive = cond.node, cond.positive
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            node, positive = node.operand, not positive
        if not is_hasattr(node):
            return None
        path = self_path(node.args[0])
        if path is None:
            return None
        classes, unresolved, _ = self.attr_classes(sym, path)
        if unresolved or not classes:
            return None
        has = {self.index.lookup(c, node.args[1].value) is not None for c in classes}
        if len(has) != 1:
            return None
        return has.pop() == positive

    def _live(self, sym: ClassSym, conds: list[Cond]) -> list[Cond] | None:
        """Conditions left after deciding the structural ones; None when a branch is dead."""
        left = []
        for cond in conds:
            value = self._static(sym, cond)
            if value is False:
                return None
            if value is None:
                left.append(cond)
        return left

    # -- reachability ------------------------------------------------------------------------

    def reach(self, sym: ClassSym) -> Reach:
        if sym not in self._reach:
            self._reach[sym] = Reach(False, "circular delegation")  # recursion guard
            self._reach[sym] = self._reach_from(sym)
        return self._reach[sym]

    def _reach_from(self, sym: ClassSym) -> Reach:
        info = self.method_info(sym)
        if info is None:
            return Reach(False, f"{sym.name} has no {SET}", path=[("", sym)])
        param = info.param
        live: list[tuple[Sink, list[Transform]]] = []
        for sink in info.sinks:
            conds = self._live(sym, sink.conds)
            if conds is None:
                continue
            trs = []
            for tr in sink.transforms:
                tconds = self._live(sym, tr.conds)
                if tconds is not None:
                    trs.append(Transform(**{**tr.__dict__, "conds": conds + tconds}))
            if trs:
                live.append((sink, trs))
        if not live:
            why = "only raises" if info.raises else "neither writes layers_to_capture nor"
            why = f"{why} passes the call on" if not info.raises else why
            if info.sinks:
                why = "passes the call only to classes that lack it"
            return Reach(False, f"{info.owner.name}.{SET} {why}", path=[("", sym)])

        for sink, _ in live:
            classes, unresolved, _ = self.attr_classes(sym, sink.target)
            where = f"self.{sink.target}" if sink.target else "self"
            if unresolved or not classes:
                return Reach(
                    False,
                    f"{info.owner.name}.{SET} acts on {where}, whose class cannot be resolved "
                    f"({'; '.join(unresolved) or 'no assignment found'})",
                    path=[("", sym)],
                    unresolved=unresolved,
                )
            for cls in classes:
                if sink.kind == "set" and not layer_uses(self.index, cls, info.owner):
                    return Reach(
                        False,
                        f"{info.owner.name}.{SET} writes {where}.{LAYERS}, "
                        f"but {cls.name} never reads {LAYERS}",
                        path=[("", sym)],
                    )
                sub = self.reach(cls) if sink.kind == "delegate" else None
                if sub is not None and not sub.ok:
                    return Reach(
                        False,
                        f"{info.owner.name}.{SET} passes the call to {where} ({cls.name}), "
                        f"where it does not arrive: {sub.reason}",
                        path=[("", sym)],
                        unresolved=sub.unresolved,
                    )

        cases = [(s, t) for s, ts in live for t in ts if not self._default_branch(t, param)]
        defaults = [t for _, ts in live for t in ts if t.kind == "default"]
        own = self._step(info, cases)
        sets = [s for s, _ in live if s.kind == "set"]
        result = Reach(True, "", path=[("", sym)], owner=("", sym), default_ids=defaults)
        if sets:
            result.steps = [own]
            holder = self.attr_classes(sym, sets[0].target)[0][0]
            result.holder = (sets[0].target, holder)
            return result
        target = next(s.target for s, _ in live)
        inner = self.attr_classes(sym, target)[0][0]
        sub = self.reach(inner)
        result.path += [(join_path(target, p), c) for p, c in sub.path]
        result.owner = (join_path(target, sub.owner[0]), sub.owner[1])
        result.holder = (join_path(target, sub.holder[0]), sub.holder[1])
        passes_ids = cases and all(t.kind == "ids" for _, t in cases)
        if not (passes_ids and own.unconditional() == 0):
            result.steps = [own]
        result.steps += sub.steps
        result.default_ids = defaults or sub.default_ids
        return result

    def _default_branch(self, tr: Transform, param: str | None) -> bool:
        if tr.kind in ("default", "none"):
            return True
        return any(is_none_test(c, param) for c in tr.conds)

    def _step(self, info: MethodInfo, cases: list[tuple[Sink, Transform]]) -> Step:
        """The ids-to-next-ids mapping of one method, as ordered cases."""
        out = []
        for sink, tr in cases:
            conds = [c for c in tr.conds if is_none_test(c, info.param) is None]
            out.append(
                Case(
                    add=tr.add if tr.kind == "ids" else None,
                    when=[c.describe() for c in conds],
                    cond_nodes=[(c.node, c.positive) for c in conds],
                    expr=tr.expr,
                    file=sink.evidence.file,
                    line=sink.evidence.line,
                    text=sink.evidence.text,
                )
            )
        return Step(cls=info.owner.name, param=info.param or "", cases=out, locals=info.locals)

    def shift_rule(self, reach: Reach) -> ShiftRule:
        return ShiftRule(steps=reach.steps)

    # -- the models a class holds -------------------------------------------------------------

    def model_children(self, sym: ClassSym) -> list[tuple[str, ClassSym, Binding]]:
        out = []
        for attr, bindings in self.composition(sym).items():
            for binding in bindings:
                for cls in binding.classes:
                    out.append((attr, cls, binding))
        return out

    def find_inner(
        self, sym: ClassSym, max_depth: int = 3
    ) -> tuple[str, ClassSym, list[ClassSym]] | None:
        """The nearest model held by ``sym`` (breadth first) whose own capture path works, and
        the other classes the same attribute can hold that have none (conditional assignment)."""
        frontier, seen = [("", sym)], {sym}
        for _ in range(max_depth):
            nxt = []
            for path, cls in frontier:
                by_attr: dict[str, list[ClassSym]] = {}
                for attr, child, _ in self.model_children(cls):
                    by_attr.setdefault(attr, [])
                    if child not in by_attr[attr]:
                        by_attr[attr].append(child)
                for attr, children in by_attr.items():
                    good = [c for c in children if self.reach(c).ok]
                    if good:
                        others = [c for c in children if c not in good]
                        return join_path(path, attr), good[0], others
                    for child in children:
                        if child not in seen:
                            seen.add(child)
                            nxt.append((join_path(path, attr), child))
            frontier = nxt
        return None
