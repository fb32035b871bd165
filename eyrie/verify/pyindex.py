"""Parse the Python files of a source tree on demand and resolve names across them.

This is the static half of "import": it maps a dotted module name to its file, records the
classes, functions, imports and aliases of each module, and follows ``from a import B as C``
chains to the definition. Parsed modules are cached by path, size and mtime, so a whole
release is parsed once per process.
"""

from __future__ import annotations

import ast
import builtins
from dataclasses import dataclass, field
from pathlib import Path

_CACHE: dict[tuple[str, int, int], Module] = {}


@dataclass
class Module:
    name: str  # dotted name, e.g. sglang.srt.models.llama
    rel: str  # file path relative to the source root, with "/"
    is_package: bool
    lines: list[str]
    tree: ast.Module
    classes: dict[str, ast.ClassDef] = field(default_factory=dict)
    functions: dict[str, ast.FunctionDef] = field(default_factory=dict)
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    assigns: dict[str, list[ast.expr]] = field(default_factory=dict)
    star_imports: list[str] = field(default_factory=list)

    def line(self, lineno: int) -> str:
        return self.lines[lineno - 1].strip() if 0 < lineno <= len(self.lines) else ""

    def segment(self, node: ast.AST) -> str:
        """The source text of a node, on one line (offsets are UTF-8 byte columns)."""
        end = getattr(node, "end_lineno", None)
        if end is None or not 0 < node.lineno <= end <= len(self.lines):
            return ast.unparse(node)
        rows = [line.encode() for line in self.lines[node.lineno - 1 : end]]
        rows[-1] = rows[-1][: node.end_col_offset]
        rows[0] = rows[0][node.col_offset :]
        return " ".join(b"\n".join(rows).decode(errors="replace").split())


# Symbols a name can resolve to.
@dataclass(frozen=True)
class ClassSym:
    module: str
    name: str

    @property
    def key(self) -> str:
        return f"{self.module}.{self.name}"


@dataclass(frozen=True)
class FuncSym:
    module: str
    name: str


@dataclass(frozen=True)
class ModuleSym:
    module: str


@dataclass(frozen=True)
class External:
    """A name from outside the indexed tree (torch, transformers, builtins)."""

    text: str


@dataclass(frozen=True)
class Unresolved:
    text: str
    reason: str


Symbol = ClassSym | FuncSym | ModuleSym | External | Unresolved


def _collect(mod: Module) -> None:
    """Record top-level definitions, including those under module-level if/try blocks."""

    def visit(stmts: list[ast.stmt]) -> None:
        for node in stmts:
            if isinstance(node, ast.ClassDef):
                mod.classes[node.name] = node
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                mod.functions[node.name] = node
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        mod.imports[alias.asname] = (alias.name, None)
                    else:
                        head = alias.name.split(".")[0]
                        mod.imports[head] = (head, None)
            elif isinstance(node, ast.ImportFrom):
                base = _absolute(mod, node.module, node.level)
                for alias in node.names:
                    if alias.name == "*":
                        mod.star_imports.append(base)
                    else:
                        mod.imports[alias.asname or alias.name] = (base, alias.name)
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        mod.assigns.setdefault(target.id, []).append(node.value)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                if node.value is not None:
                    mod.assigns.setdefault(node.target.id, []).append(node.value)
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(mod.tree.body)


def _absolute(mod: Module, name: str | None, level: int) -> str:
    if level == 0:
        return name or ""
    parts = mod.name.split(".")
    if not mod.is_package:
        parts = parts[:-1]
    parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
    return ".".join(parts + ([name] if name else []))


class SourceIndex:
    """Modules of one source root (the folder holding the top-level package)."""

    def __init__(self, root: str | Path, package: str = "sglang"):
        self.root = Path(root)
        self.package = package
        self._modules: dict[str, Module | None] = {}

    def path_of(self, dotted: str) -> tuple[Path, bool] | None:
        base = self.root.joinpath(*dotted.split("."))
        if base.with_suffix(".py").is_file():
            return base.with_suffix(".py"), False
        if (base / "__init__.py").is_file():
            return base / "__init__.py", True
        return None

    def module(self, dotted: str) -> Module | None:
        if dotted in self._modules:
            return self._modules[dotted]
        found = self.path_of(dotted) if dotted.split(".")[0] == self.package else None
        mod = None
        if found is not None:
            path, is_package = found
            stat = path.stat()
            key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
            mod = _CACHE.get(key)
            if mod is None:
                text = path.read_text(encoding="utf-8", errors="replace")
                try:
                    tree = ast.parse(text, filename=str(path))
                except SyntaxError:
                    tree = ast.Module(body=[], type_ignores=[])
                rel = path.relative_to(self.root).as_posix()
                mod = Module(dotted, rel, is_package, text.splitlines(), tree)
                _collect(mod)
                _CACHE[key] = mod
        self._modules[dotted] = mod
        return mod

    def submodules(self, dotted: str) -> list[str]:
        """Plain modules (not packages) directly inside a package, as pkgutil lists them."""
        folder = self.root.joinpath(*dotted.split("."))
        names = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
        return [f"{dotted}.{n}" for n in names]

    def is_internal(self, dotted: str) -> bool:
        return dotted.split(".")[0] == self.package

    # -- name resolution -------------------------------------------------------------------

    def resolve_name(self, mod: Module, name: str, _seen: frozenset = frozenset()) -> Symbol:
        key = (mod.name, name)
        if key in _seen:
            return Unresolved(name, f"circular alias in {mod.rel}")
        seen = _seen | {key}
        if name in mod.classes:
            return ClassSym(mod.name, name)
        if name in mod.functions:
            return FuncSym(mod.name, name)
        if name in mod.imports:
            source, attr = mod.imports[name]
            if attr is None:
                return ModuleSym(source) if self.is_internal(source) else External(source)
            return self.resolve_from(source, attr, seen)
        if name in mod.assigns:
            values = mod.assigns[name]
            if len(values) == 1 and isinstance(values[0], ast.Name | ast.Attribute):
                return self.resolve_expr(mod, values[0], seen)
            return Unresolved(name, f"assigned a computed value in {mod.rel}")
        for star in mod.star_imports:
            if self.is_internal(star) and (other := self.module(star)) is not None:
                sym = self.resolve_name(other, name, seen)
                if not isinstance(sym, Unresolved):
                    return sym
        if hasattr(builtins, name):
            return External(f"builtins.{name}")
        return Unresolved(name, f"not defined in {mod.rel}")

    def resolve_from(self, source: str, attr: str, seen: frozenset = frozenset()) -> Symbol:
        if not self.is_internal(source):
            return External(f"{source}.{attr}")
        other = self.module(source)
        if other is not None:
            sym = self.resolve_name(other, attr, seen)
            if not (isinstance(sym, Unresolved) and sym.reason.startswith("not defined")):
                return sym
        if self.path_of(f"{source}.{attr}") is not None:
            return ModuleSym(f"{source}.{attr}")
        if other is None:
            return Unresolved(f"{source}.{attr}", f"module {source} is not in this release")
        return Unresolved(f"{source}.{attr}", f"{attr} is not defined in {other.rel}")

    def resolve_expr(self, mod: Module, node: ast.expr, seen: frozenset = frozenset()) -> Symbol:
        """Resolve a Name or a dotted Attribute chain (``models.llama.LlamaModel``)."""
        if isinstance(node, ast.Name):
            return self.resolve_name(mod, node.id, seen)
        if isinstance(node, ast.Attribute):
            head = self.resolve_expr(mod, node.value, seen)
            if isinstance(head, ModuleSym):
                return self.resolve_from(head.module, node.attr, seen)
            if isinstance(head, External):
                return External(f"{head.text}.{node.attr}")
            if isinstance(head, Unresolved):
                return head
            return Unresolved(ast.unparse(node), "attribute of a class or function")
        return Unresolved(ast.unparse(node), "not a plain name")

    # -- classes ----------------------------------------------------------------------------

    def class_node(self, sym: ClassSym) -> tuple[Module, ast.ClassDef]:
        mod = self.module(sym.module)
        assert mod is not None and sym.name in mod.classes
        return mod, mod.classes[sym.name]

    def bases(self, sym: ClassSym) -> list[Symbol]:
        mod, node = self.class_node(sym)
        return [self.resolve_expr(mod, b) for b in node.bases]

    def mro(self, sym: ClassSym) -> list[ClassSym]:
        """C3 linearisation over the bases defined in the tree (external bases are left out)."""
        return self._mro(sym, frozenset())

    def _mro(self, sym: ClassSym, seen: frozenset) -> list[ClassSym]:
        if sym in seen:
            return [sym]
        parents = [b for b in self.bases(sym) if isinstance(b, ClassSym)]
        seqs = [self._mro(p, seen | {sym}) for p in parents] + [list(parents)]
        result = [sym]
        seqs = [s for s in seqs if s]
        while seqs:
            for seq in seqs:
                head = seq[0]
                if not any(head in s[1:] for s in seqs):
                    break
            else:  # inconsistent hierarchy: fall back to depth-first order
                head = seqs[0][0]
            result.append(head)
            seqs = [[c for c in s if c != head] for s in seqs]
            seqs = [s for s in seqs if s]
        return result

    def methods(self, sym: ClassSym) -> dict[str, ast.FunctionDef]:
        _, node = self.class_node(sym)
        return {
            n.name: n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }

    def lookup(self, sym: ClassSym, method: str) -> tuple[ClassSym, ast.FunctionDef] | None:
        """The definition that ``instance.method`` runs: the first in the MRO."""
        for cls in self.mro(sym):
            found = self.methods(cls).get(method)
            if found is not None:
                return cls, found
        return None
