"""Verdicts on SGLang's capture wiring, and their JSON, Markdown and terminal renderings.

``ok``: SGLang's own ``set_eagle3_layers_to_capture`` on the top-level class reaches a forward
that reads ``layers_to_capture``. ``patchable``: the top-level class does not pass it through,
but a model it holds does; the patch stage enables capture on that inner model. ``unsupported``:
no class in the chain captures aux hidden states.
"""

from __future__ import annotations

import difflib
from dataclasses import asdict

from eyrie.verify.chain import ChainAnalyzer, Reach
from eyrie.verify.findings import flag_inits, forward_findings, layer_sets, layer_uses
from eyrie.verify.pyindex import ClassSym
from eyrie.verify.registry import Entry, ReleaseFacts, entry_names
from eyrie.verify.setter import SET
from eyrie.verify.shift import ShiftError
from eyrie.verify.syntax import Evidence, join_path

VERDICTS = ("ok", "patchable", "unsupported")


def _ev(e: Evidence) -> dict:
    return asdict(e)


def _model_path(path: str) -> str:
    """The attribute path from SGLang's ``model_runner.model`` (the top-level instance)."""
    return join_path("model", path)


def verify_arch(
    an: ChainAnalyzer,
    facts: ReleaseFacts,
    entries: dict[str, Entry],
    arch: str,
    num_layers: int | None = None,
    aux_ids: list[int] | None = None,
    detail: bool = True,
) -> dict:
    """The verdict for one architecture name, with the evidence behind it."""
    entry = entries.get(arch)
    if entry is None or entry.cls is None:
        close = difflib.get_close_matches(arch, entry_names(an.index), n=3)
        hint = f" (close names: {', '.join(close)})" if close else ""
        why = (
            f"SGLang {facts.version} registers no model class named {arch} in any EntryClass of "
            f"sglang/srt/models{hint}"
        )
        if entry is not None:
            why = f"the EntryClass item {arch} cannot be resolved: {entry.unresolved}"
        return {
            "architecture": arch,
            "verdict": "unsupported",
            "why": why + ".",
            "patch": _patch("unsupported", facts, arch, None, None),
            "chain": [],
        }
    top = entry.cls
    reach = an.reach(top)
    inner = None if reach.ok else an.find_inner(top)
    if reach.ok:
        verdict, used = "ok", reach
        why = _why_ok(top, reach)
    elif inner is not None:
        verdict, used = "patchable", an.reach(inner[1])
        why = (
            f"{reach.reason}, but it holds self.{inner[0]} ({inner[1].name}), whose own "
            f"{SET} reaches {used.holder[1].name}.forward"
        )
        if inner[2]:
            names = ", ".join(c.name for c in inner[2])
            why += f" (only when it is a {inner[1].name}: it can also be {names}, which cannot)"
        why += "."
    else:
        verdict, used = "unsupported", None
        why = f"{reach.reason}, and no model it holds captures aux hidden states."
    prefix = inner[0] if inner is not None else ""
    out = {
        "architecture": arch,
        "verdict": verdict,
        "why": why,
        "patch": _patch(verdict, facts, arch, top, inner),
        "class": top.name,
        "entry": _ev(entry.evidence),
        "capture_path": _model_path(join_path(prefix, used.owner[0])) if used else None,
        "layers_holder": _model_path(join_path(prefix, used.holder[0])) if used else None,
        "delegation": _delegation(an, top, reach),
        "shift_rule": an.shift_rule(used).to_json() if used else None,
        "default_ids": [
            {"expr": t.expr, "where": t.where} for t in (used.default_ids if used else [])
        ],
        "unresolved": sorted(set(reach.unresolved + (used.unresolved if used else []))),
    }
    if used is not None and aux_ids:
        out["layer_ids"] = _layer_ids(an.shift_rule(used), aux_ids, num_layers)
    if detail:
        out["chain"] = _chain(an, top, used, prefix)
    return out


def _why_ok(top: ClassSym, reach: Reach) -> str:
    holder = reach.holder[1].name
    if len(reach.path) > 1:
        inner_path, inner = reach.path[1]
        return (
            f"{top.name}.{SET} passes the call on to self.{inner_path} ({inner.name}), which "
            f"writes layers_to_capture that {holder}.forward reads."
        )
    where = f"self.{reach.holder[0]}" if reach.holder[0] else "self"
    return f"{top.name}.{SET} writes {where}.layers_to_capture, which {holder}.forward reads."


def _patch(verdict, facts: ReleaseFacts, arch, top, inner) -> dict:
    if verdict == "ok":
        return {
            "action": "none",
            "call_on": "model",
            "sentence": f"No patch needed: the patch stage calls model.{SET}(ids) on the "
            "top-level model, as SGLang's runner does.",
        }
    if verdict == "patchable":
        path = _model_path(inner[0])
        return {
            "action": "enable_inner",
            "call_on": path,
            "sentence": f"The patch stage calls {path}.{SET}(ids) on the inner "
            f"{inner[1].name} after loading, because {top.name} does not pass it through.",
        }
    hooks = (
        " or capture with SGLang's --forward-hooks on the decoder layers"
        if facts.has_forward_hooks
        else ""
    )
    return {
        "action": "none",
        "call_on": None,
        "sentence": f"Nothing to patch: SGLang {facts.version} has no capture path for {arch}; "
        f"use capture.backend: hf{hooks}.",
    }


def _delegation(an: ChainAnalyzer, top: ClassSym, reach: Reach) -> dict:
    info = an.method_info(top)
    if info is None:
        return {"found": False, "defined": None, "to": [], "evidence": [], "raises": []}
    delegates = [s for s in info.sinks if s.kind == "delegate"]
    return {
        "found": bool(delegates),
        "defined": _ev(info.definition),
        "to": sorted({_model_path(s.target) for s in delegates}),
        "evidence": [_ev(s.evidence) for s in delegates],
        "conditions": [[c.describe() for c in s.conds] for s in delegates],
        "raises": [{**_ev(e), "when": [c.describe() for c in conds]} for e, conds in info.raises],
    }


def _layer_ids(rule, aux_ids, num_layers) -> dict:
    out = {"aux_ids": list(aux_ids), "layers_to_capture": [i + 1 for i in aux_ids]}
    try:
        out["pass_to_sglang"] = rule.ids_for(list(aux_ids), num_layers)
    except ShiftError as exc:
        out["pass_to_sglang"] = None
        out["error"] = str(exc)
        out["impossible"] = str(exc).startswith("no ids make")
    return out


def _chain(an: ChainAnalyzer, top: ClassSym, used: Reach | None, prefix: str) -> list[dict]:
    """One entry per class on the capture path, each with its cited evidence."""
    levels: list[tuple[str, ClassSym]] = [("", top)]
    if used is not None:
        for path, cls in used.path:
            levels.append((join_path(prefix, path), cls))
        levels.append((join_path(prefix, used.holder[0]), used.holder[1]))
    else:
        levels += [(attr, cls) for attr, cls, _ in an.model_children(top)]
    seen, out = set(), []
    for path, cls in levels:
        if (path, cls) in seen:
            continue
        seen.add((path, cls))
        out.append(_level(an, top, path, cls, levels))
    return out


def _level(an: ChainAnalyzer, top, path, cls, levels) -> dict:
    children = [
        p[len(path) :].lstrip(".").split(".")[0]
        for p, _ in levels
        if p != path and (not path or p.startswith(path + "."))
    ]
    nxt = children[0] if children else None
    attribute, unresolved = [], []
    if path:
        parent = path.rpartition(".")[0]
        parent_cls = next(c for p, c in levels if p == parent)
        for binding in an.composition(parent_cls).get(path.rpartition(".")[2], []):
            attribute.append(_ev(binding.evidence))
    for attr, bindings in an.composition(cls).items():
        for binding in bindings:
            unresolved += [f"self.{attr}: {u}" for u in binding.unresolved]
    info = an.method_info(cls)
    fwd = forward_findings(an.index, cls, nxt)
    setter = None
    if info is not None:
        setter = {
            "defined": _ev(info.definition),
            "sets": [_ev(s.evidence) for s in info.sinks if s.kind == "set"],
            "delegates": [_ev(s.evidence) for s in info.sinks if s.kind == "delegate"],
            "flags": [_ev(e) for e in info.flags],
            "guards": [_ev(e) for e in info.guards],
            "raises": [_ev(e) for e, _ in info.raises],
        }
    return {
        "path": _model_path(path),
        "class": cls.name,
        "defined": _ev(an.class_evidence(cls)),
        "bases": [c.name for c in an.index.mro(cls)[1:]],
        "assigned": attribute,
        "capture_flag_init": [_ev(e) for e in flag_inits(an.index, cls)],
        "forward": _ev(fwd["forward"]) if fwd["forward"] else None,
        "forward_checks_flag": [_ev(e) for e in fwd["checks_flag"]],
        "forward_unpacks_aux": [_ev(e) for e in fwd["unpacks_aux"]],
        "forward_uses_child": [_ev(e) for e in fwd["uses_child"]],
        "layers_to_capture_set": [_ev(e) for e in layer_sets(an.index, cls)],
        "layers_to_capture_used": [_ev(e) for e in layer_uses(an.index, cls)],
        "set_eagle3_layers_to_capture": setter,
        "unresolved": unresolved,
    }


def release_json(source, facts: ReleaseFacts) -> dict:
    return {
        "version": facts.version,
        "source": str(source.package),
        "origin": source.origin,
        "runner": {
            "behaviour": facts.runner_behaviour,
            "calls": [
                {
                    **_ev(c.evidence),
                    "function": c.function,
                    "behaviour": c.behaviour,
                    "when_missing": c.when_missing,
                    "args": c.args,
                }
                for c in facts.runner_calls
            ],
        },
        "forward_hooks": {
            "available": facts.has_forward_hooks,
            "evidence": [_ev(e) for e in facts.hooks],
        },
    }


def registry(an: ChainAnalyzer, facts: ReleaseFacts, entries: dict[str, Entry]) -> dict:
    """Every EntryClass of the release, classified; counts per verdict."""
    rows = []
    for arch in entries:
        res = verify_arch(an, facts, entries, arch, detail=False)
        rows.append(
            {
                "architecture": arch,
                "module": res.get("entry", {}).get("file", ""),
                "verdict": res["verdict"],
                "capture_path": res.get("capture_path"),
                "shift": (res.get("shift_rule") or {}).get("kind", "-"),
                "why": res["why"],
            }
        )
    counts = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
    return {"counts": counts, "rows": rows}


# -- rendering -----------------------------------------------------------------------------


def table(headers: list[str], rows: list[list], markdown: bool = False, width: int = 0) -> str:
    """A plain aligned table, or a Markdown pipe table."""
    cells = [[_cell(v, markdown, width) for v in row] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in cells]
        return "\n".join(lines)
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    fmt = lambda r: "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()  # noqa: E731
    return "\n".join([fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells])


def _cell(value, markdown: bool, width: int) -> str:
    text = "-" if value in (None, "") else str(value)
    if width and len(text) > width:
        text = text[: width - 1] + "…"
    return text.replace("|", "\\|") if markdown else text


def _cite(e: dict) -> str:
    return f"{e['file']}:{e['line']}"


def render(report: dict, markdown: bool = False) -> str:
    """The report for people: release facts, the verdict table, then each chain's evidence."""
    out = []
    h = (lambda t: f"## {t}") if markdown else (lambda t: f"{t}\n{'=' * len(t)}")
    code = (lambda t: f"`{t}`") if markdown else (lambda t: t)
    if markdown:
        out.append("# Eyrie verify report\n")
    for check in report.get("sglang", []):
        rel = check["release"]
        out.append(h(f"SGLang {rel['version']} ({rel['origin']}: {rel['source']})"))
        out.append("")
        out.append(f"- runner: {rel['runner']['behaviour']}")
        for c in rel["runner"]["calls"]:
            out.append(f"  - {code(_cite(c))} {code(c['text'])}: args {c['args']}")
        hooks = "yes" if rel["forward_hooks"]["available"] else "no"
        out.append(f"- --forward-hooks mechanism: {hooks}")
        for e in rel["forward_hooks"]["evidence"]:
            out.append(f"  - {code(_cite(e))} {code(e['text'])}")
        out.append("")
        if "registry" in check:
            counts = check["registry"]["counts"]
            out.append("Counts: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
            out.append("")
            rows = [
                [
                    r["architecture"],
                    r["module"].rpartition("/")[2],
                    r["verdict"],
                    r["capture_path"],
                    r["shift"],
                    r["why"],
                ]
                for r in check["registry"]["rows"]
            ]
            headers = ["architecture", "module", "verdict", "capture path", "shift", "why"]
            out.append(table(headers, rows, markdown, width=0 if markdown else 90))
            out.append("")
        for res in check.get("targets", []):
            out += _render_target(res, markdown, code)
    for res in report.get("hf", []):
        out += _render_hf(res, markdown, code, h)
    for note in report.get("notes", []):
        out.append(f"Note: {note}")
    for failure in report.get("failures", []):
        out.append(f"FAILED: {failure}")
    return "\n".join(out).rstrip() + "\n"


def _render_target(res: dict, markdown: bool, code) -> list[str]:
    out = []
    rule = res.get("shift_rule") or {}
    rows = [
        ["verdict", res["verdict"]],
        ["why", res["why"]],
        ["patch", res["patch"]["sentence"]],
        ["capture switched on at", res.get("capture_path")],
        ["layers_to_capture read by", res.get("layers_holder")],
        ["shift rule", rule.get("summary")],
        ["default ids", "; ".join(d["expr"] for d in res.get("default_ids", []))],
    ]
    deleg = res.get("delegation")
    if deleg is not None:
        rows.append(["top-level delegates", ", ".join(deleg["to"]) if deleg["found"] else "no"])
    if res.get("layer_ids"):
        ids = res["layer_ids"]
        rows.append(["aux ids (layer outputs)", ids["aux_ids"]])
        rows.append(["ids to pass to SGLang", ids.get("pass_to_sglang") or ids.get("error")])
    if res.get("unresolved"):
        rows.append(["unresolved", "; ".join(res["unresolved"])])
    title = f"{res['architecture']}: {res['verdict']}"
    out.append(f"### {title}" if markdown else title)
    out.append("")
    out.append(table(["item", "finding"], rows, markdown))
    out.append("")
    chain = res.get("chain") or []
    if chain:
        rows = []
        for lvl in chain:
            for key, label in [
                ("defined", "class"),
                ("assigned", "assigned"),
                ("capture_flag_init", "flag init"),
                ("forward_checks_flag", "forward checks flag"),
                ("forward_unpacks_aux", "forward unpacks aux"),
                ("forward_uses_child", "forward uses child"),
                ("layers_to_capture_set", "layers_to_capture set"),
                ("layers_to_capture_used", "layers_to_capture used"),
            ]:
                items = lvl.get(key)
                items = [items] if isinstance(items, dict) else items or []
                for e in items:
                    rows.append([lvl["path"], lvl["class"], label, code(_cite(e)), e["text"]])
            setter = lvl.get("set_eagle3_layers_to_capture")
            if setter is None:
                rows.append([lvl["path"], lvl["class"], SET, "-", "absent"])
            else:
                for key in ("defined", "guards", "raises", "flags", "sets", "delegates"):
                    items = setter[key]
                    items = [items] if isinstance(items, dict) else items
                    for e in items:
                        rows.append(
                            [lvl["path"], lvl["class"], f"{SET}: {key}", code(_cite(e)), e["text"]]
                        )
        out.append(
            table(
                ["path", "class", "finding", "file:line", "source"],
                rows,
                markdown,
                width=0 if markdown else 70,
            )
        )
        out.append("")
    return out


def _render_hf(res: dict, markdown: bool, code, h) -> list[str]:
    out = [h(f"transformers module tree: {res['architecture']}"), ""]
    rows = [
        ["verdict", res["verdict"]],
        ["why", res["why"]],
        ["decoder layers", f"{res.get('layers_path')} ({res.get('num_layers')} layers)"],
        ["final norm", res.get("norm_path")],
        ["aux ids", res.get("aux_layer_ids")],
        ["aux modules", ", ".join(res.get("aux_modules") or [])],
    ]
    out.append(table(["item", "finding"], rows, markdown))
    out.append("")
    return out
