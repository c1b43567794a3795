"""Code versions that mean the code: a hash of the syntax trees of exactly the functions an experiment runs.

Starting from an experiment's functions (its unit function, unit list and reduction), :func:`code_version` follows
every name they use: a function or class defined in the package is hashed (its syntax tree without docstrings,
comments or formatting) and followed in turn; an attribute of a package module (``modadd.train``) is resolved and
followed; a module-level constant (``K_EIGS = 5``) is hashed by its value. Names outside the package (torch, numpy)
and the package's infrastructure modules (result store, sweeps, parameters, progress bars, reports, plots, the
command line), which do not change numbers, are not followed.

So rewording a docstring, reformatting, or editing an analysis function that the experiment does not call keeps
the version (hours of committed results stay current), while a changed constant or expression anywhere on the
experiment's call graph changes it. Dynamic look-ups (``getattr(mod, name)`` with a computed name) are not seen:
the package does not use them on computation paths.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import textwrap
import types
from typing import Any, Iterable

PACKAGE = "grokspectra"
INFRASTRUCTURE = {f"{PACKAGE}.{m}" for m in (
    "store", "sweep", "params", "progress", "report", "plotting", "nbtools", "cli", "experiments", "version",
    "published", "__main__")}
_SIMPLE = (int, float, complex, str, bytes, bool, type(None))


def _in_package(obj: Any) -> bool:
    mod = getattr(obj, "__module__", None) if not isinstance(obj, types.ModuleType) else obj.__name__
    return isinstance(mod, str) and (mod == PACKAGE or mod.startswith(PACKAGE + ".")) and mod not in INFRASTRUCTURE


class _Strip(ast.NodeTransformer):
    """Drop docstrings (comments and formatting never reach the tree)."""

    def _body(self, node):
        self.generic_visit(node)
        b = node.body
        if b and isinstance(b[0], ast.Expr) and isinstance(getattr(b[0], "value", None), ast.Constant) \
                and isinstance(b[0].value.value, str):
            node.body = b[1:] or [ast.Pass()]
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = visit_Module = _body


def _code_text(co: types.CodeType) -> str:
    """A code object as text (bytecode, constants and names, recursively) — used when no source parses alone,
    e.g. a lambda inside a dict literal."""
    consts = [(_code_text(c) if isinstance(c, types.CodeType) else repr(c)) for c in co.co_consts]
    return f"code({co.co_code.hex()},{consts},{co.co_names})"


def tree_text(obj: Any) -> str:
    """The syntax tree of a function or class as text, without docstrings, comments or formatting."""
    try:
        src = textwrap.dedent(inspect.getsource(obj))
        tree = _Strip().visit(ast.parse(src))
    except (SyntaxError, OSError, TypeError):
        if inspect.isfunction(obj):
            return _code_text(obj.__code__)
        raise
    return ast.dump(tree, annotate_fields=False, include_attributes=False)


def _code_names(co: types.CodeType) -> set[str]:
    """Every global and attribute name a code object (and the code nested in it) refers to."""
    names = set(co.co_names)
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


def _constant(v: Any) -> str | None:
    """A stable text for a module-level constant, or None when it is not a plain value."""
    if isinstance(v, _SIMPLE):
        return repr(v)
    if isinstance(v, (tuple, list, frozenset, set)):
        parts = [_constant(x) for x in (sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v)]
        return None if any(p is None for p in parts) else f"{type(v).__name__}({','.join(parts)})"
    if isinstance(v, dict):
        parts = [(_constant(k), _constant(x)) for k, x in v.items()]
        return None if any(a is None or b is None for a, b in parts) else "dict(" + ",".join(f"{a}:{b}" for a, b in parts) + ")"
    return None


def dependencies(roots: Iterable[Any]) -> dict[str, str]:
    """``{qualified name: text}`` for every package function, class and constant reachable from ``roots``."""
    out: dict[str, str] = {}
    todo = [r for r in roots if r is not None]
    seen: set[int] = set()
    while todo:
        obj = todo.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        obj = inspect.unwrap(obj) if callable(obj) else obj
        if hasattr(obj, "fn") and hasattr(obj, "section") and not inspect.isfunction(obj):  # an Experiment object
            todo.extend(getattr(obj, "roots", lambda: [obj.fn])())
            continue
        if not (inspect.isfunction(obj) or inspect.isclass(obj)) or not _in_package(obj):
            continue
        qual = f"{obj.__module__}.{obj.__qualname__}"
        text = tree_text(obj)
        out[qual] = text
        if inspect.isfunction(obj):
            g, names = obj.__globals__, _code_names(obj.__code__)
        else:
            g = vars(inspect.getmodule(obj))
            names = set()
            for v in vars(obj).values():
                f = getattr(v, "__func__", v)
                if inspect.isfunction(f):
                    names |= _code_names(f.__code__)
        for name in names:
            if name not in g:
                continue
            v = g[name]
            if isinstance(v, types.ModuleType):
                if _in_package(v):
                    for a in names:  # attributes of a package module that this code may read (a superset)
                        w = getattr(v, a, None)
                        if w is None or isinstance(w, types.ModuleType):
                            continue
                        c = None if callable(w) else _constant(w)
                        if c is not None:
                            out[f"{v.__name__}.{a}"] = c
                        elif callable(w):
                            todo.append(w)
                continue
            if inspect.isfunction(v) or inspect.isclass(v):
                todo.append(v)
                continue
            c = _constant(v)
            if c is not None:
                out[f"{obj.__module__}.{name}"] = c
            elif isinstance(v, (dict, list, tuple)):  # e.g. a table of functions
                todo.extend(x for x in (v.values() if isinstance(v, dict) else v) if callable(x))
    return out


def code_version(roots: Iterable[Any]) -> str:
    """A 12-hex-digit hash of :func:`dependencies` of ``roots``."""
    h = hashlib.sha256()
    for name, text in sorted(dependencies(roots).items()):
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()[:12]
