"""Evidence about one model class: where it reads the capture list, what its forward does.

The chain walk decides whether capture can reach a class; these findings show, with citations,
that the class really uses it: reads of ``layers_to_capture`` (or of a marker the setter puts on
each layer), the forward's check of the flag, its unpacking of the aux states.
"""

from __future__ import annotations

import ast

from eyrie.verify.pyindex import ClassSym, Module, SourceIndex
from eyrie.verify.setter import FLAG, LAYERS, SETTERS
from eyrie.verify.syntax import Evidence, assign_targets, attr_call, evidence, self_path


def _module_of(index: SourceIndex, sym: ClassSym) -> Module:
    return index.class_node(sym)[0]


def layer_uses(index: SourceIndex, sym: ClassSym, setter: ClassSym | None = None) -> list[Evidence]:
    """Where capture happens: reads of ``self.layers_to_capture`` outside the setters, or
    reads of a per-layer marker that a setter writes (``setattr(layer, "_is_...", True)``)."""
    uses = _self_attr_loads(index, sym, LAYERS, skip=SETTERS)
    markers = set()
    for cls in {*index.mro(sym), *([setter] if setter else [])}:
        for name, fn in index.methods(cls).items():
            if name in SETTERS:
                markers |= _marker_names(fn)
    for cls in index.mro(sym):
        mod = _module_of(index, cls)
        for name, fn in index.methods(cls).items():
            if name in SETTERS:
                continue
            for node in ast.walk(fn):
                named = attr_call(node, ("getattr", "hasattr"), (2, 3))
                read = (named is not None and named.value in markers) or (
                    isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Load)
                    and node.attr in markers
                )
                if read:
                    what = f"{cls.name}.{name} reads a capture marker"
                    uses.append(evidence(mod, node, what))
    return uses


def _self_attr_loads(index: SourceIndex, sym, attr, skip=(), only=None) -> list[Evidence]:
    out = []
    for cls in index.mro(sym):
        mod = _module_of(index, cls)
        for name, fn in index.methods(cls).items():
            if name in skip or (only is not None and name not in only):
                continue
            if only is not None and index.lookup(sym, name)[0] != cls:
                continue  # overridden in a subclass: not what runs
            seen = set()
            for node in ast.walk(fn):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr == attr
                    and isinstance(node.ctx, ast.Load)
                    and self_path(node.value) == ""
                    and node.lineno not in seen
                ):
                    seen.add(node.lineno)
                    out.append(evidence(mod, node, f"{cls.name}.{name} reads self.{attr}"))
    return sorted(out, key=lambda e: (e.file, e.line))


def _self_attr_stores(index: SourceIndex, sym, attr, only=None) -> list[Evidence]:
    out = []
    for cls in index.mro(sym):
        mod = _module_of(index, cls)
        for name, fn in index.methods(cls).items():
            if only is not None and name not in only:
                continue
            for stmt in ast.walk(fn):
                for target, _ in assign_targets(stmt) if isinstance(stmt, ast.stmt) else []:
                    path = self_path(target) if isinstance(target, ast.Attribute) else None
                    if path == attr:
                        out.append(evidence(mod, stmt, f"{cls.name}.{name} sets self.{attr}"))
    return sorted(out, key=lambda e: (e.file, e.line))


def forward_findings(index: SourceIndex, sym: ClassSym, next_attr: str | None) -> dict:
    """What ``forward`` (the one that runs) does with the flag, the aux states, the child."""
    found = index.lookup(sym, "forward")
    if found is None:
        return {"forward": None, "checks_flag": [], "unpacks_aux": [], "uses_child": []}
    owner, fn = found
    mod = _module_of(index, owner)
    checks, unpacks, uses = [], [], []
    for node in ast.walk(fn):
        if isinstance(node, ast.If | ast.IfExp) and any(
            isinstance(n, ast.Attribute) and n.attr == FLAG for n in ast.walk(node.test)
        ):
            checks.append(evidence(mod, node, f"{owner.name}.forward checks {FLAG}"))
        if isinstance(node, ast.Assign):
            names = [
                n.id
                for t in node.targets
                if isinstance(t, ast.Tuple)
                for n in t.elts
                if isinstance(n, ast.Name)
            ]
            if any("aux" in n for n in names):
                unpacks.append(evidence(mod, node, f"{owner.name}.forward unpacks aux states"))
        if (
            next_attr
            and isinstance(node, ast.Attribute)
            and node.attr == next_attr
            and self_path(node.value) == ""
        ):
            uses.append(evidence(mod, node, f"{owner.name}.forward uses self.{next_attr}"))
    dedup = lambda evs: list({e.line: e for e in evs}.values())  # noqa: E731
    return {
        "forward": evidence(mod, fn, f"{owner.name}.forward defined"),
        "checks_flag": dedup(checks),
        "unpacks_aux": dedup(unpacks),
        "uses_child": dedup(uses),
    }


def flag_inits(index: SourceIndex, sym: ClassSym) -> list[Evidence]:
    return _self_attr_stores(index, sym, FLAG, only={"__init__"})


def layer_sets(index: SourceIndex, sym: ClassSym) -> list[Evidence]:
    return _self_attr_stores(index, sym, LAYERS)


def _marker_names(fn: ast.FunctionDef) -> set[str]:
    """Attribute names a setter marks layers with: ``setattr(x, "NAME", ...)``, ``x.NAME = ...``."""
    names = set()
    for node in ast.walk(fn):
        if (named := attr_call(node, ("setattr",), (3,))) is not None:
            names.add(named.value)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and self_path(target) is None:
                    names.add(target.attr)
    return names - {LAYERS, FLAG}
