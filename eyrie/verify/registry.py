"""Release-wide facts: the model registry (EntryClass), how the runner calls the capture
switch, and whether SGLang's own ``--forward-hooks`` mechanism exists."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

from eyrie.verify.pyindex import ClassSym, SourceIndex
from eyrie.verify.setter import SET
from eyrie.verify.syntax import Evidence, evidence, is_hasattr, walk_branches

MODELS = "sglang.srt.models"
RUNNER_SCOPE = ("sglang/srt",)
HOOKS_MODULE = "sglang.srt.model_executor.hook_manager"


@dataclass
class Entry:
    arch: str  # the name SGLang registers: the class's __name__
    cls: ClassSym | None
    evidence: Evidence
    unresolved: str = ""


def entry_classes(index: SourceIndex, only: set[str] | None = None) -> dict[str, Entry]:
    """Every architecture the release registers, as its registry does: the ``EntryClass`` of
    each plain module directly inside sglang/srt/models, keyed by class name.

    With ``only``, modules whose text names none of those classes are not parsed at all.
    """
    found: dict[str, Entry] = {}
    for dotted in index.submodules(MODELS):
        if only is not None:
            path = index.path_of(dotted)[0]
            text = path.read_text(encoding="utf-8", errors="replace")
            if "EntryClass" not in text or not any(re.search(rf"\b{n}\b", text) for n in only):
                continue
        mod = index.module(dotted)
        if mod is None:
            continue
        for node in mod.tree.body:
            if not (
                isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets)
            ):
                continue
            ev = evidence(mod, node, "EntryClass")
            for item in _items(node.value):
                sym = index.resolve_expr(mod, item)
                if isinstance(sym, ClassSym):
                    found.setdefault(sym.name, Entry(sym.name, sym, ev))
                else:
                    text = ast.unparse(item)
                    found.setdefault(text, Entry(text, None, ev, unresolved=str(sym)))
    return dict(sorted(found.items()))


def entry_names(index: SourceIndex) -> list[str]:
    """Names listed in EntryClass lines, found by text search: for "did you mean" hints."""
    names = set()
    for dotted in index.submodules(MODELS):
        text = index.path_of(dotted)[0].read_text(encoding="utf-8", errors="replace")
        for m in re.finditer(r"^EntryClass\s*=\s*(\[.*?\]|\w+)", text, re.M | re.S):
            names.update(re.findall(r"\b[A-Z]\w+\b", m.group(1)))
    return sorted(names)


def _items(value: ast.expr) -> list[ast.expr]:
    if isinstance(value, ast.List | ast.Tuple):
        return [i for e in value.elts for i in _items(e)]
    if isinstance(value, ast.BinOp) and isinstance(value.op, ast.Add):
        return _items(value.left) + _items(value.right)
    if isinstance(value, ast.Starred):
        return _items(value.value)
    return [value]


@dataclass
class RunnerCall:
    """One place outside the model files that calls set_eagle3_layers_to_capture."""

    evidence: Evidence
    function: str
    behaviour: str  # "raises" | "skips" | "blind"
    when_missing: str
    args: str


@dataclass
class ReleaseFacts:
    version: str
    runner_calls: list[RunnerCall] = field(default_factory=list)
    runner_behaviour: str = ""
    hooks: list[Evidence] = field(default_factory=list)

    @property
    def has_forward_hooks(self) -> bool:
        return bool(self.hooks)


def _hasattr_of(node: ast.AST) -> bool:
    return any(is_hasattr(n, SET) for n in ast.walk(node))


def _runner_calls_in(mod) -> list[RunnerCall]:
    calls = []
    functions = [n for n in ast.walk(mod.tree) if isinstance(n, ast.FunctionDef)]
    for fn in functions:
        raise_guard = None
        for stmt, conds in walk_branches(fn.body, [], mod):
            if (
                isinstance(stmt, ast.If)
                and _hasattr_of(stmt.test)
                and any(isinstance(s, ast.Raise) for s in ast.walk(stmt))
                and isinstance(stmt.test, ast.UnaryOp | ast.BoolOp)
            ):
                raise_guard = stmt
            if isinstance(stmt, ast.If | ast.While | ast.For):
                continue  # its body is visited on its own
            for node in ast.walk(stmt):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr == SET
                ):
                    continue
                guarded = [c for c in conds if c.positive and _hasattr_of(c.node)]
                if raise_guard is not None and raise_guard.lineno < node.lineno:
                    behaviour = "raises"
                    missing = f"raises an error ({mod.rel}:{raise_guard.lineno})"
                elif guarded:
                    behaviour = "skips"
                    missing = "skips the call silently: capture stays off"
                else:
                    behaviour = "blind"
                    missing = "calls it unchecked: AttributeError at start-up"
                args = ", ".join(mod.segment(a) for a in node.args) or "(no ids: model default)"
                ev = evidence(mod, node, f"runner calls {SET}")
                calls.append(RunnerCall(ev, fn.name, behaviour, missing, args))
    return calls


def release_facts(index: SourceIndex, version: str) -> ReleaseFacts:
    """Grep the non-model source once: runner calls of the capture switch (then parsed) and
    the forward-hooks mechanism (its functions, where the runner registers it, its option)."""
    facts = ReleaseFacts(version)
    root = index.root
    hook_calls, hook_option = [], []
    for scope in RUNNER_SCOPE:
        for path in sorted((root / scope).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel.startswith("sglang/srt/models/"):
                continue
            text = path.read_text(encoding="utf-8", errors="replace")
            if "forward_hooks" in text or "forward-hooks" in text:
                for no, line in enumerate(text.splitlines(), 1):
                    bare = line.strip()
                    if "register_forward_hooks(" in bare and not bare.startswith(("def ", "#")):
                        hook_calls.append(Evidence("runner registers forward hooks", rel, no, bare))
                    elif '"--forward-hooks"' in bare or bare.startswith("forward_hooks:"):
                        hook_option.append(Evidence("forward-hooks option", rel, no, bare))
            if SET in text:
                mod = index.module(".".join(Path(rel).with_suffix("").parts))
                if mod is not None:
                    facts.runner_calls += _runner_calls_in(mod)
    kinds = sorted({c.behaviour for c in facts.runner_calls})
    words = {
        "raises": "checks with hasattr and raises when the model lacks it",
        "skips": "checks with hasattr and silently skips when the model lacks it",
        "blind": "calls it without a check (AttributeError when the model lacks it)",
    }
    facts.runner_behaviour = (
        "; ".join(words[k] for k in kinds) if kinds else "never calls it (no runner call found)"
    )
    mod = index.module(HOOKS_MODULE)
    if mod is not None:
        facts.hooks = [
            evidence(mod, n, "forward-hooks mechanism")
            for n in mod.tree.body
            if isinstance(n, ast.FunctionDef) and "hook" in n.name
        ]
        facts.hooks += hook_calls + hook_option
    return facts
