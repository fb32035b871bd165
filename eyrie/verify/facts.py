"""Facts read from an SGLang source tree that the capture patch rests on, each with its evidence.

Each fact is found by parsing the release's source (never by importing it) and comes with the
file, line and text it was read from, so the patch bundle's manifest can cite it and the
extraction can refuse an installation whose cited files changed.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

FORWARD_BATCH = "sglang/srt/model_executor/forward_batch_info.py"
SCHEDULE_BATCH = "sglang/srt/managers/schedule_batch.py"
HOOK_MANAGER = "sglang/srt/model_executor/hook_manager.py"
VERSION_FILE = "sglang/version.py"
# Flags every capture server gets, when the release defines them: token ids in and out; no
# prefix cache (a cached prefix is never computed, so its states would be missing); eager
# execution (module hooks do not run inside CUDA graphs or compiled regions); all-reduces not
# fused into the next layer (a layer's output must be complete on every tensor-parallel rank).
REQUIRED_FLAGS = (
    "skip_tokenizer_init",
    "disable_radix_cache",
    "disable_cuda_graph",
    "disable_piecewise_cuda_graph",
    "enforce_disable_flashinfer_allreduce_fusion",
)


def _evidence(root: Path, rel: str, line: int, what: str) -> dict:
    text = (root / rel).read_text(errors="replace").splitlines()[line - 1].strip()
    return {"what": what, "file": rel, "line": line, "text": text}


def class_field(root: Path, rel: str, cls: str, name: str) -> dict | None:
    """Where class `cls` of file `rel` declares field `name` (an annotated class attribute)."""
    path = root / rel
    if not path.is_file():
        return None
    for node in ast.walk(ast.parse(path.read_text(errors="replace"))):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if (
                    isinstance(item, ast.AnnAssign)
                    and isinstance(item.target, ast.Name)
                    and item.target.id == name
                ):
                    return _evidence(root, rel, item.lineno, f"{cls}.{name}")
    return None


def self_attributes(root: Path, rel: str, cls: str, names: tuple[str, ...]) -> dict[str, dict]:
    """Where class `cls` assigns self.<name> (in any method), for each of `names`."""
    found: dict[str, dict] = {}
    path = root / rel
    if not path.is_file():
        return found
    for node in ast.walk(ast.parse(path.read_text(errors="replace"))):
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for sub in ast.walk(node):
                targets = sub.targets if isinstance(sub, ast.Assign) else []
                if isinstance(sub, ast.AnnAssign):
                    targets = [sub.target]
                flat = []
                for t in targets:
                    flat += list(t.elts) if isinstance(t, ast.Tuple | ast.List) else [t]
                for t in flat:
                    if (
                        isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id == "self"
                        and t.attr in names
                        and t.attr not in found
                    ):
                        what = f"{cls} sets self.{t.attr}"
                        found[t.attr] = _evidence(root, rel, sub.lineno, what)
    return found


def server_flags(root: Path) -> dict[str, dict | None]:
    """Which of REQUIRED_FLAGS the release defines (server_args.py or arg_groups/ fields)."""
    files = [root / "sglang/srt/server_args.py"]
    files += sorted((root / "sglang/srt/arg_groups").rglob("*.py"))
    out: dict[str, dict | None] = dict.fromkeys(REQUIRED_FLAGS)
    for path in files:
        if not path.is_file():
            continue
        rel = path.relative_to(root).as_posix()
        for no, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = re.match(r"\s+(\w+)\s*:", line)
            if m and m.group(1) in out and out[m.group(1)] is None:
                out[m.group(1)] = {
                    "what": f"option --{m.group(1).replace('_', '-')}",
                    "file": rel,
                    "line": no,
                    "text": line.strip(),
                }
    return out
