"""What a model class holds: ``self.<attr> = <model class>(...)`` in ``__init__``, resolved.

A wrapper passes the capture call to a model it builds in ``__init__``, often through a helper,
a parameter bound by ``super().__init__(...)``, a conditional or a class attribute. This module
follows those, statically, to the classes an attribute can be, and names what it cannot resolve.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass

from eyrie.verify.pyindex import (
    ClassSym,
    External,
    FuncSym,
    Module,
    ModuleSym,
    SourceIndex,
    Unresolved,
)
from eyrie.verify.syntax import Evidence, assign_targets, evidence, self_path, walk_branches

MODELS_PACKAGE = "sglang.srt.models"


@dataclass
class Binding:
    """``self.<attr> = <value>`` in ``__init__``: the classes the value can be."""

    attr: str
    classes: list[ClassSym]
    unresolved: list[str]
    evidence: Evidence
    conditional: bool
    alias_of: str | None = None  # "language_model.model" for self.model = self.language_model.model


@dataclass
class Ctx:
    """Where an expression is evaluated: its module, function, locals and bound parameters."""

    mod: Module
    fn: ast.FunctionDef
    local: dict[str, list[ast.expr]]
    imports: dict[str, tuple[str, str]]
    params: dict[str, Ctx]
    expr: ast.expr | None = None

    def at(self, expr: ast.expr) -> Ctx:
        return Ctx(self.mod, self.fn, self.local, self.imports, self.params, expr)

    def values_of(self, name: str) -> list[Ctx]:
        """What a name can hold: its assignments in the function, else its parameter binding."""
        if name in self.local:
            rest = {k: v for k, v in self.local.items() if k != name}
            inner = Ctx(self.mod, self.fn, rest, self.imports, self.params)
            return [inner.at(v) for v in self.local[name]]
        if name in self.params:
            return [self.params[name]]
        return []


def _ctx(mod: Module, fn: ast.FunctionDef, params: dict[str, Ctx]) -> Ctx:
    """A function's context: its local assignments and its function-level imports."""
    local, imports = _scope(fn)
    return Ctx(mod, fn, local, imports, params)


@functools.lru_cache(maxsize=4096)
def _scope(fn: ast.FunctionDef) -> tuple[dict, dict]:
    local: dict[str, list[ast.expr]] = {}
    imports: dict[str, tuple[str, str]] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    local.setdefault(target.id, []).append(node.value)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                imports[alias.asname or alias.name] = (node.module, alias.name)
    return local, imports


class Composition:
    """The attributes of one release's model classes, resolved once and cached."""

    def __init__(self, index: SourceIndex):
        self.index = index
        self._composition: dict[ClassSym, dict[str, list[Binding]]] = {}

    def module_of(self, sym: ClassSym) -> Module:
        return self.index.class_node(sym)[0]

    def is_model_class(self, sym: ClassSym) -> bool:
        return sym.module.startswith(MODELS_PACKAGE + ".")

    def composition(self, sym: ClassSym) -> dict[str, list[Binding]]:
        if sym not in self._composition:
            self._composition[sym] = {}  # guards recursion through self-referencing helpers
            self._composition[sym] = self._compose(sym)
        return self._composition[sym]

    def _compose(self, sym: ClassSym) -> dict[str, list[Binding]]:
        result: dict[str, list[Binding]] = {}
        params = self._init_params(sym)
        for cls in reversed(self.index.mro(sym)):
            init = self.index.methods(cls).get("__init__")
            if init is None:
                continue
            found: dict[str, list[Binding]] = {}
            for owner, fn in [(cls, init), *self._init_helpers(sym, init)]:
                mod = self.module_of(owner)
                ctx = _ctx(mod, fn, params.get(cls, {}) if fn is init else {})
                for stmt, conds in walk_branches(fn.body, [], mod):
                    for target, value in assign_targets(stmt):
                        path = self_path(target)
                        if path is None or "." in path or not path:
                            continue
                        binding = self._binding(sym, ctx, path, stmt, value, conds)
                        if binding is not None:
                            found.setdefault(path, []).append(binding)
            result.update(found)  # a subclass's assignment replaces its parent's
        return result

    def _init_params(self, sym: ClassSym) -> dict[ClassSym, dict[str, Ctx]]:
        """For each class in the MRO, what its ``__init__`` parameters are bound to: the
        arguments a subclass passes through ``super().__init__(...)``, else the defaults."""
        mro = self.index.mro(sym)
        bound: dict[ClassSym, dict[str, Ctx]] = {}
        for i, cls in enumerate(mro):
            init = self.index.methods(cls).get("__init__")
            if init is None:
                continue
            mod = self.module_of(cls)
            own = bound.setdefault(cls, {})
            names = [a.arg for a in init.args.args[1:]]
            defaults = init.args.defaults
            for name, default in zip(names[len(names) - len(defaults) :], defaults, strict=True):
                own.setdefault(name, Ctx(mod, init, {}, {}, {}, default))
            for kwarg, default in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True):
                if default is not None:
                    own.setdefault(kwarg.arg, Ctx(mod, init, {}, {}, {}, default))
            here = _ctx(mod, init, own)
            for call in ast.walk(init):
                if not (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "__init__"
                ):
                    continue
                target, args = self._super_target(mod, mro, i, call)
                if target is None:
                    continue
                tinit = self.index.methods(target).get("__init__")
                tnames = [a.arg for a in tinit.args.args[1:]] if tinit else []
                theirs = bound.setdefault(target, {})
                for name, arg in zip(tnames, args, strict=False):
                    theirs[name] = here.at(arg)
                for kw in call.keywords:
                    if kw.arg is not None:
                        theirs[kw.arg] = here.at(kw.value)
        return bound

    def _super_target(self, mod, mro, i, call) -> tuple[ClassSym | None, list[ast.expr]]:
        owner = call.func.value
        if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name):
            if owner.func.id == "super":
                for parent in mro[i + 1 :]:
                    if "__init__" in self.index.methods(parent):
                        return parent, list(call.args)
            return None, []
        sym = self.index.resolve_expr(mod, owner)
        if isinstance(sym, ClassSym) and call.args:
            return sym, list(call.args[1:])  # Base.__init__(self, ...)
        return None, []

    def _init_helpers(self, sym: ClassSym, init: ast.FunctionDef):
        """Methods that ``__init__`` calls as plain statements (``self._build()``)."""
        for stmt in init.body:
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
                func = stmt.value.func
                if isinstance(func, ast.Attribute) and self_path(func.value) == "":
                    found = self.index.lookup(sym, func.attr)
                    if found is not None and found[1] is not init:
                        yield found

    def _binding(self, sym, ctx: Ctx, attr, stmt, value, conds) -> Binding | None:
        ev = evidence(ctx.mod, stmt, f"self.{attr} assigned")
        alias = self_path(value) if isinstance(value, ast.Attribute) else None
        if alias:
            return Binding(attr, [], [], ev, bool(conds), alias_of=alias)
        classes, unresolved = self._instances(sym, ctx, value, 0)
        classes = [c for c in dict.fromkeys(classes) if self.is_model_class(c)]
        if not classes and not unresolved:
            return None
        return Binding(attr, classes, unresolved, ev, bool(conds))

    def _instances(self, sym, ctx: Ctx, value, depth) -> tuple[list[ClassSym], list[str]]:
        """Classes an expression's value can be an instance of; unresolved texts besides."""
        classes: list[ClassSym] = []
        unresolved: list[str] = []
        if depth > 6:
            return classes, [ctx.mod.segment(value)]
        parts: list[Ctx] = []
        if isinstance(value, ast.IfExp):
            parts = [ctx.at(value.body), ctx.at(value.orelse)]
        elif isinstance(value, ast.BoolOp):
            parts = [ctx.at(v) for v in value.values]
        elif isinstance(value, ast.Name):
            parts = ctx.values_of(value.id)
        elif isinstance(value, ast.Call):
            for target in self._callee(sym, ctx, value.func, depth):
                if isinstance(target, ClassSym):
                    classes.append(target)
                elif isinstance(target, Ctx):  # a function whose returned calls count
                    for ret in ast.walk(target.fn):
                        if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Call):
                            parts.append(target.at(ret.value))
                elif isinstance(target, Unresolved):
                    unresolved.append(f"{ctx.mod.segment(value.func)} ({target.reason})")
        for part in parts:
            c, u = self._instances(sym, part, part.expr, depth + 1)
            classes += c
            unresolved += u
        return classes, unresolved

    def _callee(self, sym, ctx: Ctx, func, depth) -> list:
        """What a called expression can be: classes, functions to look into, or unresolved."""
        if depth > 6:
            return [Unresolved(ctx.mod.segment(func), "too many indirections")]
        if isinstance(func, ast.Name) and func.id in ctx.imports:
            base, attr = ctx.imports[func.id]
            return self._symbol_callee(self.index.resolve_from(base, attr), ctx, func, depth)
        if isinstance(func, ast.Name) and (func.id in ctx.local or func.id in ctx.params):
            out = []
            for part in ctx.values_of(func.id):
                node = part.expr
                if isinstance(node, ast.Name | ast.Attribute | ast.IfExp | ast.BoolOp):
                    out += self._callee(sym, part, node, depth + 1)
                elif isinstance(node, ast.Call):
                    out.append(Unresolved(part.mod.segment(node), "class chosen at run time"))
                elif not (isinstance(node, ast.Constant) and node.value is None):
                    out.append(Unresolved(part.mod.segment(node), "computed class"))
            return out or [Unresolved(func.id, "parameter without a known class")]
        if isinstance(func, ast.IfExp):
            return self._callee(sym, ctx, func.body, depth + 1) + self._callee(
                sym, ctx, func.orelse, depth + 1
            )
        if isinstance(func, ast.BoolOp):
            return [t for v in func.values for t in self._callee(sym, ctx, v, depth + 1)]
        if isinstance(func, ast.Attribute) and self_path(func.value) == "":
            found = self.index.lookup(sym, func.attr)
            if found is not None:
                owner, fn = found
                return [_ctx(self.module_of(owner), fn, {})]
            attr = self._class_attribute(sym, func.attr)
            if attr is not None:
                owner_mod, node = attr
                return self._callee(sym, Ctx(owner_mod, ctx.fn, {}, {}, {}), node, depth + 1)
            return [Unresolved(ctx.mod.segment(func), "not a method or class attribute")]
        if isinstance(func, ast.Name | ast.Attribute):
            return self._symbol_callee(self.index.resolve_expr(ctx.mod, func), ctx, func, depth)
        if isinstance(func, ast.Constant) and func.value is None:
            return []
        return [Unresolved(ctx.mod.segment(func), "computed callee")]

    def _symbol_callee(self, resolved, ctx: Ctx, func, depth: int) -> list:
        if isinstance(resolved, FuncSym):
            fmod = self.index.module(resolved.module)
            fn = fmod.functions[resolved.name]
            return [_ctx(fmod, fn, {})] if depth < 3 else []
        if isinstance(resolved, ModuleSym):
            return [Unresolved(ctx.mod.segment(func), "a module is called")]
        if isinstance(resolved, External):
            return []
        return [resolved]

    def _class_attribute(self, sym: ClassSym, name: str):
        for cls in self.index.mro(sym):
            cmod, node = self.index.class_node(cls)
            for stmt in node.body:
                for target, value in assign_targets(stmt):
                    if isinstance(target, ast.Name) and target.id == name:
                        return cmod, value
        return None

    def attr_classes(self, sym: ClassSym, path: str) -> tuple[list[ClassSym], list[str], list]:
        """Classes behind ``self.<path>``, unresolved texts, and the bindings on the way."""
        if not path:
            return [sym], [], []
        current, unresolved, bindings = [sym], [], []
        for attr in path.split("."):
            nxt: list[ClassSym] = []
            for cls in current:
                found = self.composition(cls).get(attr)
                if not found:
                    unresolved.append(f"self.{attr} of {cls.name} (no model class assigned)")
                    continue
                for binding in found:
                    bindings.append(binding)
                    if binding.alias_of:
                        classes, more, via = self.attr_classes(cls, binding.alias_of)
                        nxt += classes
                        unresolved += more
                        bindings += via
                    nxt += binding.classes
                    unresolved += binding.unresolved
            current = list(dict.fromkeys(nxt))
        return current, unresolved, bindings
