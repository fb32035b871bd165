"""The public documentation of the running Python's standard library, walked in sorted order.

Every importable public module (tests, GUI toolkits, deprecated packages and modules that act
when imported skipped) gives its own docstring and those of its public functions, classes,
methods and attributes, each object once under its first name. Signatures are shown without
anything that ties them to this machine (paths, addresses, a virtualenv's defaults), so the
dataset built from them depends only on the Python version and platform.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import io
import os
import pkgutil
import re
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

MIN_DOC_CHARS = 20

# Top-level modules that are tests, GUI toolkits, deprecated, or act when imported
# (print, open a browser, write grammar caches, touch the terminal).
SKIP_TOP = {
    "antigravity",
    "idlelib",
    "lib2to3",
    "distutils",
    "readline",
    "rlcompleter",
    "test",
    "this",
    "tkinter",
    "turtle",
    "turtledemo",
    "pydoc_data",
}
# Submodule name parts that are never walked: tests, command-line entry points, per-codec tables.
SKIP_PARTS = {"test", "tests", "idle_test", "__main__"}
SKIP_PREFIXES = ("encodings.",)
# Modules better known by the name programs use for them.
DISPLAY_NAMES = {"posixpath": "os.path"}

# Boilerplate that C types and enums inherit; it says nothing about the object itself.
GENERIC_DOCS = (
    "An enumeration.",
    "Create and return a new object.",
    "Initialize self.",
    "Helper for pickle.",
    "Alias for field number",
)


@dataclass
class Entry:
    """One documented object: a function, class or method."""

    qualname: str  # e.g. "json.dumps", "json.JSONEncoder.encode"
    module: str
    kind: str  # function | class | method | attribute | object
    signature: str | None
    doc: str


@dataclass
class ModuleDoc:
    name: str
    doc: str | None
    entries: list[Entry] = field(default_factory=list)


def _skip(name: str) -> bool:
    parts = name.split(".")
    if parts[0] in SKIP_TOP or name.startswith(SKIP_PREFIXES):
        return True
    return any(p.startswith("_") or p in SKIP_PARTS for p in parts)


def _quiet_import(name: str):
    """Import a module with its output and warnings swallowed; None when it cannot be imported."""
    sink = io.StringIO()
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
        ):
            warnings.simplefilter("ignore")
            return importlib.import_module(name)
    except BaseException:  # noqa: BLE001 - a module that fails to import (or exits) is skipped
        return None


def stdlib_module_names() -> list[str]:
    """Every importable public stdlib module (packages walked recursively), sorted."""
    found: set[str] = set()

    def visit(name: str) -> None:
        if _skip(name) or name in found:
            return
        mod = _quiet_import(name)
        if mod is None:
            return
        found.add(name)
        for info in pkgutil.iter_modules(getattr(mod, "__path__", None) or []):
            visit(f"{name}.{info.name}")

    for top in sorted(sys.stdlib_module_names):
        visit(top)
    return sorted(found)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


class _SortedRepr:
    """Stands in for a set default so its repr does not depend on the hash seed."""

    def __init__(self, value):
        self.value = value

    def __repr__(self) -> str:
        name = type(self.value).__name__
        body = ", ".join(sorted(repr(v) for v in self.value))
        return f"{name}({{{body}}})" if body else f"{name}()"


# Defaults computed from the running interpreter's environment when their module is imported
# (sysconfig's scheme is "venv" inside a virtualenv, "posix_prefix" outside): shown as the
# expression the source writes, so the dataset does not depend on where it is rebuilt.
_ENVIRONMENT_DEFAULTS = {("sysconfig", "scheme"): "get_default_scheme()"}


class _ShownAs:
    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _machine_strings() -> list[str]:
    """Strings that would tie the dataset to this machine (paths, user names)."""
    values = {sys.executable, sys.prefix, sys.base_prefix, sys.exec_prefix, os.getcwd()}
    values |= {os.path.dirname(os.__file__)}
    values.add(os.path.expanduser("~"))
    return sorted(v for v in values if v and len(v) > 1)


def signature(obj, shown_name: str) -> str | None:
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = []
    for p in sig.parameters.values():
        shown = _ENVIRONMENT_DEFAULTS.get((getattr(obj, "__module__", None), p.name))
        if shown is not None and p.default is not p.empty:
            p = p.replace(default=_ShownAs(shown))
        elif isinstance(p.default, set | frozenset):
            p = p.replace(default=_SortedRepr(p.default))
        params.append(p)
    try:
        text = f"{shown_name}{sig.replace(parameters=params)}"
    except (TypeError, ValueError):
        return None
    text = _ADDRESS.sub("", text)
    if any(s in text for s in _machine_strings()):
        return None
    return text


def _own_doc(obj) -> str | None:
    """The object's own docstring (not one inherited from a base class), cleaned."""
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str):
        return None
    doc = inspect.cleandoc(doc).strip()
    if len(doc) < MIN_DOC_CHARS or doc.startswith(GENERIC_DOCS):
        return None
    return doc


def _public_names(mod) -> list[str]:
    names = getattr(mod, "__all__", None)
    if isinstance(names, list | tuple) and all(isinstance(n, str) for n in names):
        return sorted(n for n in set(names) if not n.startswith("_"))
    out = []
    for name, value in vars(mod).items():
        if name.startswith("_"):
            continue
        if getattr(value, "__module__", None) == mod.__name__:
            out.append(name)
    return sorted(out)


# Dunder methods whose docstrings describe pickling or interpreter plumbing, not the class.
SKIP_DUNDERS = {
    "__class_getitem__",
    "__getnewargs__",
    "__getnewargs_ex__",
    "__getstate__",
    "__init_subclass__",
    "__reduce__",
    "__reduce_ex__",
    "__setstate__",
    "__sizeof__",
    "__subclasshook__",
}


def _callable_member(value):
    """The underlying function of a class attribute, or None for data and nested types."""
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    if inspect.isfunction(value) or inspect.isbuiltin(value) or inspect.ismethoddescriptor(value):
        return value
    return None


def _own_instance_doc(value) -> bool:
    """A module-level instance (not a routine or module) documented apart from its type."""
    if inspect.ismodule(value) or inspect.isroutine(value):
        return False
    doc = getattr(value, "__doc__", None)
    return isinstance(doc, str) and doc != getattr(type(value), "__doc__", None)


def _is_attribute(value) -> bool:
    return (
        isinstance(value, property)
        or inspect.isgetsetdescriptor(value)
        or inspect.ismemberdescriptor(value)
    )


def _class_members(cls) -> Iterator[tuple[str, object]]:
    """(name, raw attribute) the class documents: its own public and special methods, plus the
    public ones it inherits from private base classes (whose docs appear nowhere else)."""
    for name in sorted(dir(cls)):
        owner = next((k for k in cls.__mro__ if name in vars(k)), None)
        if owner is None:
            continue
        dunder = name.startswith("__") and name.endswith("__")
        if dunder:
            keep = owner is cls and name not in SKIP_DUNDERS
        elif name.startswith("_"):
            keep = False
        else:
            keep = owner is cls or owner.__name__.startswith("_")
        if keep:
            yield name, vars(owner)[name]


def module_entries(mod, seen: set | None = None, shown: str | None = None) -> list[Entry]:
    """Documented functions, classes, methods and attributes of one module. Across calls sharing
    `seen`, each object and each docstring is used once (a re-export, or a docstring copied onto
    several objects, is documented under its first name only)."""
    seen = set() if seen is None else seen
    shown = shown or mod.__name__
    entries: list[Entry] = []

    def add(obj, qual: str, kind: str, sig_obj=None) -> None:
        if id(obj) in seen:
            return
        seen.add(id(obj))
        doc = _own_doc(obj)
        if doc and doc not in seen:
            seen.add(doc)
            sig = signature(sig_obj, qual) if sig_obj is not None else None
            entries.append(Entry(qual, shown, kind, sig, doc))

    for name in _public_names(mod):
        value = getattr(mod, name, None)
        qual = f"{shown}.{name}"
        if inspect.isclass(value):
            if id(value) in seen:
                continue
            add(value, qual, "class", value)
            for mname, raw in _class_members(value):
                fn = _callable_member(raw)
                if fn is not None:
                    add(fn, f"{qual}.{mname}", "method", fn)
                elif _is_attribute(raw) and not mname.startswith("_"):
                    add(raw, f"{qual}.{mname}", "attribute")
        elif inspect.isfunction(value) or inspect.isbuiltin(value):
            add(value, qual, "function", value)
        elif _own_instance_doc(value):
            add(value, qual, "object")  # e.g. typing.Optional: an instance with its own doc
    return entries


def collect_modules() -> list[ModuleDoc]:
    mods, seen = [], set()
    for name in stdlib_module_names():
        mod = sys.modules.get(name) or _quiet_import(name)
        if mod is not None:
            shown = DISPLAY_NAMES.get(name, name)
            mods.append(ModuleDoc(shown, _own_doc(mod), module_entries(mod, seen, shown)))
    return mods
