"""Walk a model class of SGLang, statically, to see whether aux-hidden-state capture reaches it.

SGLang turns EAGLE-3 capture on by calling ``model.set_eagle3_layers_to_capture(ids)`` on the
top-level model class. That method usually sets ``self.capture_aux_hidden_states`` and writes
``self.model.layers_to_capture``, which the base model's ``forward`` reads; wrapper classes
(vision-language models and the like) must pass the call on to their language model. This module
follows that path through inheritance and composition (``self.x = SomeModel(...)`` in
``__init__``) and records every step as ``file:line`` evidence, without importing anything.
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass, field

from eyrie.verify.pyindex import (
    ClassSym,
    External,
    FuncSym,
    Module,
    ModuleSym,
    SourceIndex,
    Unresolved,
)
from eyrie.verify.shift import Case, ShiftRule, Step

SET = "set_eagle3_layers_to_capture"
FLAG = "capture_aux_hidden_states"
LAYERS = "layers_to_capture"
MODELS_PACKAGE = "sglang.srt.models"
_SETTERS = {SET, "set_dflash_layers_to_capture", "set_dspark_layers_to_capture", "__init__"}


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
class Binding:
    """``self.<attr> = <value>`` in ``__init__``: the classes the value can be."""

    attr: str
    classes: list[ClassSym]
    unresolved: list[str]
    evidence: Evidence
    conditional: bool
    alias_of: str | None = None  # "language_model.model" for self.model = self.language_model.model


@dataclass
class Cond:
    """A condition an action sits under; ``positive`` is False in the else branch."""

    text: str
    positive: bool
    node: ast.expr = field(repr=False, compare=False)

    def describe(self) -> str:
        return self.text if self.positive else f"not ({self.text})"


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


def _self_path(node: ast.expr) -> str | None:
    """The path "a.b" for ``self.a.b``, "" for ``self``, None when not rooted at self."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "self":
        return ".".join(reversed(parts))
    return None


def _join(path: str, attr: str) -> str:
    return f"{path}.{attr}" if path and attr else path or attr


def _walk(stmts: list[ast.stmt], conds: list[Cond], mod: Module):
    """Yield (simple statement, enclosing conditions), descending into compound statements."""
    for stmt in stmts:
        if isinstance(stmt, ast.If):
            text = mod.segment(stmt.test)
            yield stmt, conds
            yield from _walk(stmt.body, [*conds, Cond(text, True, stmt.test)], mod)
            yield from _walk(stmt.orelse, [*conds, Cond(text, False, stmt.test)], mod)
        elif isinstance(stmt, ast.For | ast.AsyncFor | ast.While | ast.With | ast.AsyncWith):
            yield stmt, conds
            yield from _walk(stmt.body, conds, mod)
            yield from _walk(getattr(stmt, "orelse", []), conds, mod)
        elif isinstance(stmt, ast.Try):
            yield from _walk(stmt.body, conds, mod)
            for handler in stmt.handlers:
                yield from _walk(handler.body, conds, mod)
            yield from _walk(stmt.orelse + stmt.finalbody, conds, mod)
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


def _exprs(stmt: ast.stmt):
    for top in _header_nodes(stmt):
        yield from ast.walk(top)


def _assign_targets(stmt: ast.stmt) -> list[tuple[ast.expr, ast.expr]]:
    if isinstance(stmt, ast.Assign):
        return [(t, stmt.value) for t in stmt.targets]
    if isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
        return [(stmt.target, stmt.value)]
    return []


def _is_none_test(cond: Cond, param: str | None) -> bool | None:
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


class ChainAnalyzer:
    """Static questions about one release's model classes, answered once and cached."""

    def __init__(self, index: SourceIndex):
        self.index = index
        self._composition: dict[ClassSym, dict[str, list[Binding]]] = {}
        self._method: dict[ClassSym, MethodInfo | None] = {}
        self._reach: dict[ClassSym, Reach] = {}

    # -- basic lookups ------------------------------------------------------------------------

    def module_of(self, sym: ClassSym) -> Module:
        return self.index.class_node(sym)[0]

    def class_evidence(self, sym: ClassSym) -> Evidence:
        mod, node = self.index.class_node(sym)
        return evidence(mod, node, f"class {sym.name}")

    def is_model_class(self, sym: ClassSym) -> bool:
        return sym.module.startswith(MODELS_PACKAGE + ".")

    def method_evidence(self, sym: ClassSym, name: str) -> tuple[ClassSym, Evidence] | None:
        found = self.index.lookup(sym, name)
        if found is None:
            return None
        owner, fn = found
        return owner, evidence(self.module_of(owner), fn, f"{owner.name}.{name} defined")

    # -- composition: self.<attr> = <model class>(...) ------------------------------------------

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
                for stmt, conds in _walk(fn.body, [], mod):
                    for target, value in _assign_targets(stmt):
                        path = _self_path(target)
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
                if isinstance(func, ast.Attribute) and _self_path(func.value) == "":
                    found = self.index.lookup(sym, func.attr)
                    if found is not None and found[1] is not init:
                        yield found

    def _binding(self, sym, ctx: Ctx, attr, stmt, value, conds) -> Binding | None:
        ev = evidence(ctx.mod, stmt, f"self.{attr} assigned")
        alias = _self_path(value) if isinstance(value, ast.Attribute) else None
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
        if isinstance(func, ast.Attribute) and _self_path(func.value) == "":
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
                for target, value in _assign_targets(stmt):
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

    # -- what set_eagle3_layers_to_capture does ----------------------------------------------

    def method_info(self, sym: ClassSym) -> MethodInfo | None:
        found = self.index.lookup(sym, SET)
        if found is None:
            return None
        owner, fn = found
        if owner not in self._method:
            self._method[owner] = self._analyze_method(owner, fn)
        return self._method[owner]

    def _analyze_method(self, owner: ClassSym, fn: ast.FunctionDef) -> MethodInfo:
        mod = self.module_of(owner)
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
        for stmt, conds in _walk(fn.body, [], mod):
            for target, value in _assign_targets(stmt):
                path = _self_path(target) if isinstance(target, ast.Attribute) else None
                if isinstance(target, ast.Name):
                    local.setdefault(target.id, []).append((value, conds, stmt.lineno))
                    info.locals[target.id] = value
                elif path is not None and path.split(".")[-1] == LAYERS:
                    tr = self._transforms(mod, value, param, local, stmt.lineno)
                    where = path.rpartition(".")[0]
                    info.sinks.append(
                        Sink("set", where, tr, conds, evidence(mod, stmt, f"{path} set"))
                    )
                elif path is not None and path.split(".")[-1] == FLAG:
                    info.flags.append(evidence(mod, stmt, f"{path} set"))
            if isinstance(stmt, ast.Raise):
                info.raises.append((evidence(mod, stmt, "raises"), conds))
            for node in _exprs(stmt):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == SET
                ):
                    target = _self_path(node.func.value)
                    if target is None or target == "":
                        continue
                    arg = node.args[0] if node.args else None
                    for kw in node.keywords:
                        if kw.arg in (None, param, "layer_ids", LAYERS):
                            arg = kw.value
                    tr = (
                        self._transforms(mod, arg, param, local, stmt.lineno)
                        if arg is not None
                        else [Transform("none", expr="(no ids: the callee's default)")]
                    )
                    ev = evidence(mod, stmt, f"passes the call to self.{target}")
                    info.sinks.append(Sink("delegate", target, tr, conds, ev))
        return info

    def _transforms(self, mod, value, param, local, lineno, depth=0) -> list[Transform]:
        """How ``value`` relates to the id parameter, one Transform per way it can be bound."""
        if depth > 4:
            return [Transform("unknown", expr=mod.segment(value), node=value)]
        if isinstance(value, ast.Name):
            out = []
            if value.id == param:
                out.append(Transform("ids", 0, expr=param, node=value))
            for bound, conds, line in local.get(value.id, []):
                if line < lineno:
                    for tr in self._transforms(mod, bound, param, local, line, depth + 1):
                        tr.conds = conds + tr.conds
                        out.append(tr)
            return out or [Transform("unknown", expr=value.id, node=value)]
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id in ("list", "tuple")
            and len(value.args) == 1
        ):
            return self._transforms(mod, value.args[0], param, local, lineno, depth + 1)
        if isinstance(value, ast.ListComp) and len(value.generators) == 1:
            gen = value.generators[0]
            add = _elt_shift(value.elt, gen.target)
            if not gen.ifs and add is not None:
                out = []
                for tr in self._transforms(mod, gen.iter, param, local, lineno, depth + 1):
                    if tr.kind == "ids":
                        tr.add += add
                    elif tr.kind == "default":
                        tr = self._default(mod, value, local, lineno, tr.conds)
                    out.append(tr)
                return out
        names = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
        if param not in names and not any(
            self._depends(n, param, local, lineno, 0) for n in names if n in local
        ):
            return [self._default(mod, value, local, lineno, [])]
        return [Transform("unknown", expr=mod.segment(value), node=value)]

    def _depends(self, name, param, local, lineno, depth) -> bool:
        if depth > 4:
            return True
        for bound, _, line in local.get(name, []):
            if line >= lineno:
                continue
            names = {n.id for n in ast.walk(bound) if isinstance(n, ast.Name)}
            if param in names or any(
                self._depends(n, param, local, line, depth + 1) for n in names if n in local
            ):
                return True
        return False

    def _default(self, mod, value, local, lineno, conds) -> Transform:
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

    # -- static truth of structural conditions -----------------------------------------------

    def _static(self, sym: ClassSym, cond: Cond) -> bool | None:
        """Decide ``hasattr(self.x, "name")`` from the classes behind self.x; None if unknown."""
        node, positive = cond.node, cond.positive
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            node, positive = node.operand, not positive
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "hasattr"
            and len(node.args) == 2
            and isinstance(node.args[1], ast.Constant)
        ):
            return None
        path = _self_path(node.args[0])
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
                if sink.kind == "set" and not self.layer_uses(cls, info.owner):
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
        result.path += [(_join(target, p), c) for p, c in sub.path]
        result.owner = (_join(target, sub.owner[0]), sub.owner[1])
        result.holder = (_join(target, sub.holder[0]), sub.holder[1])
        passes_ids = cases and all(t.kind == "ids" for _, t in cases)
        if not (passes_ids and own.unconditional() == 0):
            result.steps = [own]
        result.steps += sub.steps
        result.default_ids = defaults or sub.default_ids
        return result

    def _default_branch(self, tr: Transform, param: str | None) -> bool:
        if tr.kind in ("default", "none"):
            return True
        return any(_is_none_test(c, param) for c in tr.conds)

    def _step(self, info: MethodInfo, cases: list[tuple[Sink, Transform]]) -> Step:
        """The ids-to-next-ids mapping of one method, as ordered cases."""
        out = []
        for sink, tr in cases:
            conds = [c for c in tr.conds if _is_none_test(c, info.param) is None]
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

    # -- evidence about one class --------------------------------------------------------------

    def layer_uses(self, sym: ClassSym, setter: ClassSym | None = None) -> list[Evidence]:
        """Where capture happens: reads of ``self.layers_to_capture`` outside the setters, or
        reads of a per-layer marker that a setter writes (``setattr(layer, "_is_...", True)``)."""
        uses = self._self_attr_loads(sym, LAYERS, skip=_SETTERS)
        markers = set()
        for cls in {*self.index.mro(sym), *([setter] if setter else [])}:
            for name, fn in self.index.methods(cls).items():
                if name in _SETTERS:
                    markers |= _marker_names(fn)
        for cls in self.index.mro(sym):
            mod = self.module_of(cls)
            for name, fn in self.index.methods(cls).items():
                if name in _SETTERS:
                    continue
                for node in ast.walk(fn):
                    read = (
                        isinstance(node, ast.Call)
                        and isinstance(node.func, ast.Name)
                        and node.func.id in ("getattr", "hasattr")
                        and len(node.args) >= 2
                        and isinstance(node.args[1], ast.Constant)
                        and node.args[1].value in markers
                    ) or (
                        isinstance(node, ast.Attribute)
                        and isinstance(node.ctx, ast.Load)
                        and node.attr in markers
                    )
                    if read:
                        what = f"{cls.name}.{name} reads a capture marker"
                        uses.append(evidence(mod, node, what))
        return uses

    def _self_attr_loads(self, sym, attr, skip=(), only=None) -> list[Evidence]:
        out = []
        for cls in self.index.mro(sym):
            mod = self.module_of(cls)
            for name, fn in self.index.methods(cls).items():
                if name in skip or (only is not None and name not in only):
                    continue
                if only is not None and self.index.lookup(sym, name)[0] != cls:
                    continue  # overridden in a subclass: not what runs
                seen = set()
                for node in ast.walk(fn):
                    if (
                        isinstance(node, ast.Attribute)
                        and node.attr == attr
                        and isinstance(node.ctx, ast.Load)
                        and _self_path(node.value) == ""
                        and node.lineno not in seen
                    ):
                        seen.add(node.lineno)
                        out.append(evidence(mod, node, f"{cls.name}.{name} reads self.{attr}"))
        return sorted(out, key=lambda e: (e.file, e.line))

    def _self_attr_stores(self, sym, attr, only=None) -> list[Evidence]:
        out = []
        for cls in self.index.mro(sym):
            mod = self.module_of(cls)
            for name, fn in self.index.methods(cls).items():
                if only is not None and name not in only:
                    continue
                for stmt in ast.walk(fn):
                    for target, _ in _assign_targets(stmt) if isinstance(stmt, ast.stmt) else []:
                        path = _self_path(target) if isinstance(target, ast.Attribute) else None
                        if path == attr:
                            out.append(evidence(mod, stmt, f"{cls.name}.{name} sets self.{attr}"))
        return sorted(out, key=lambda e: (e.file, e.line))

    def forward_findings(self, sym: ClassSym, next_attr: str | None) -> dict:
        """What ``forward`` (the one that runs) does with the flag, the aux states, the child."""
        found = self.index.lookup(sym, "forward")
        if found is None:
            return {"forward": None, "checks_flag": [], "unpacks_aux": [], "uses_child": []}
        owner, fn = found
        mod = self.module_of(owner)
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
                and _self_path(node.value) == ""
            ):
                uses.append(evidence(mod, node, f"{owner.name}.forward uses self.{next_attr}"))
        dedup = lambda evs: list({e.line: e for e in evs}.values())  # noqa: E731
        return {
            "forward": evidence(mod, fn, f"{owner.name}.forward defined"),
            "checks_flag": dedup(checks),
            "unpacks_aux": dedup(unpacks),
            "uses_child": dedup(uses),
        }

    def flag_inits(self, sym: ClassSym) -> list[Evidence]:
        return self._self_attr_stores(sym, FLAG, only={"__init__"})

    def layer_sets(self, sym: ClassSym) -> list[Evidence]:
        return self._self_attr_stores(sym, LAYERS)

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
                        return _join(path, attr), good[0], others
                    for child in children:
                        if child not in seen:
                            seen.add(child)
                            nxt.append((_join(path, attr), child))
            frontier = nxt
        return None


def _marker_names(fn: ast.FunctionDef) -> set[str]:
    """Attribute names a setter marks layers with: ``setattr(x, "NAME", ...)``, ``x.NAME = ...``."""
    names = set()
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) == 3
            and isinstance(node.args[1], ast.Constant)
        ):
            names.add(node.args[1].value)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and _self_path(target) is None:
                    names.add(target.attr)
    return names - {LAYERS, FLAG}


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
