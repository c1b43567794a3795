"""Declared, validated parameters for notebooks and experiments, and the parameter profiles in ``params/``.

Papermill only *warns* about parameters a notebook does not declare, so each notebook declares a :class:`Schema`
and checks the names its parameters cell and papermill's injected cell defined (:meth:`Schema.from_namespace`).
Unknown names, wrong types and out-of-range values raise :class:`ParamError`, naming the parameter and what is
allowed.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml

REPO = Path(__file__).resolve().parents[2]
PROFILE_DIR = REPO / "params"


class ParamError(ValueError):
    """A notebook or experiment parameter is unknown, missing, mistyped or out of range."""


def parse_value(text: str) -> Any:
    """A command-line parameter value, read exactly as papermill reads ``-p NAME VALUE`` (``papermill/cli.py``,
    ``_resolve_type``): ``True``/``False``/``None``, then anything ``int()`` accepts, then anything ``float()``
    accepts (``1e-3``, ``inf``), else the text itself. So ``-p eta 1e-3`` is the float 0.001 and ``-p times [8,20]``
    is the *string* ``"[8,20]"``; a list is given as YAML with ``-y "times: [8, 20]"`` (:func:`parse_yaml`).
    ``check``, ``run --set`` and the notebook all see the same value."""
    if not isinstance(text, str):
        return text
    if text == "True":
        return True
    if text == "False":
        return False
    if text == "None":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


class _NoDatesSafeLoader(yaml.SafeLoader):
    """PyYAML's safe loader without the timestamp resolver: papermill's loader for ``-y``/``-f`` parameters
    (``papermill/iorw.py``, ``NoDatesSafeLoader``), so a date-like value stays a string."""

    yaml_implicit_resolvers = {k: [r for r in v if r[0] != "tag:yaml.org,2002:timestamp"]
                               for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}


def parse_yaml(text: str, where: str = "-y") -> dict[str, Any]:
    """Parameters given as a YAML mapping (papermill's ``-y``), read with papermill's loader. Raises
    :class:`ParamError` naming ``where`` when the text is not YAML or not a mapping."""
    try:
        data = yaml.load(text, Loader=_NoDatesSafeLoader)
    except yaml.YAMLError as err:
        raise ParamError(f"{where}: not valid YAML ({_yaml_reason(err)})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ParamError(f"{where}: expected a mapping of parameter names to values, got {type(data).__name__}")
    return data


def _yaml_reason(err: Exception) -> str:
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else str(problem)


@dataclasses.dataclass(frozen=True)
class Param:
    """One parameter: its type (``int``, ``float``, ``str``, ``bool`` or ``list`` of one of those), an optional
    closed range ``[lo, hi]`` (applied to each element of a list), optional allowed ``choices``, a help text."""

    name: str
    type: type
    lo: float | None = None
    hi: float | None = None
    choices: tuple | None = None
    of: type | None = None  # element type for lists
    help: str = ""

    def allowed(self) -> str:
        t = f"list of {self.of.__name__}" if self.type is list else self.type.__name__
        parts = [t]
        if self.choices is not None:
            parts.append(f"one of {list(self.choices)}")
        if self.lo is not None or self.hi is not None:
            parts.append(f"in [{self.lo if self.lo is not None else '-inf'}, {self.hi if self.hi is not None else 'inf'}]")
        return ", ".join(parts)

    def _check_scalar(self, v: Any, t: type, where: str) -> Any:
        if t is float and isinstance(v, int) and not isinstance(v, bool):
            v = float(v)
        if t is int and isinstance(v, float) and v.is_integer():
            v = int(v)
        if not isinstance(v, t) or (t in (int, float) and isinstance(v, bool)):
            raise ParamError(f"parameter {where!r} = {v!r} has type {type(v).__name__}; allowed: {self.allowed()}")
        if self.choices is not None and v not in self.choices:
            raise ParamError(f"parameter {where!r} = {v!r} is not allowed; allowed: {self.allowed()}")
        if self.lo is not None and v < self.lo or self.hi is not None and v > self.hi:
            raise ParamError(f"parameter {where!r} = {v!r} is out of range; allowed: {self.allowed()}")
        return v

    def check(self, v: Any) -> Any:
        if self.type is list:
            if isinstance(v, tuple):
                v = list(v)
            if not isinstance(v, list) or not v:
                hint = (f" (papermill's -p passes {v!r} as text; give a list as YAML: -y \"{self.name}: [...]\")"
                        if isinstance(v, str) else "")
                raise ParamError(f"parameter {self.name!r} = {v!r} must be a non-empty list; allowed: {self.allowed()}"
                                 + hint)
            return [self._check_scalar(x, self.of, f"{self.name}[{i}]") for i, x in enumerate(v)]
        return self._check_scalar(v, self.type, self.name)


class Schema:
    """The declared parameters of one notebook (or chapter of experiments)."""

    def __init__(self, *params: Param):
        self.params = {p.name: p for p in params}

    def __contains__(self, name: str) -> bool:
        return name in self.params

    def validate(self, values: Mapping[str, Any], *, partial: bool = False) -> dict[str, Any]:
        """Check ``values`` against the schema and return them (ints widened to floats where declared)."""
        unknown = sorted(set(values) - set(self.params))
        if unknown:
            raise ParamError(f"unknown parameter(s) {unknown}; this notebook declares: {sorted(self.params)}")
        missing = [] if partial else sorted(set(self.params) - set(values))
        if missing:
            raise ParamError(f"missing parameter(s) {missing}")
        return {k: self.params[k].check(v) for k, v in values.items()}

    def from_namespace(self, ns: Mapping[str, Any], before: Iterable[str]) -> dict[str, Any]:
        """Validate the names defined after ``before`` was taken (the parameters cell plus papermill's injected
        cell). Any new public name that is not declared is an unknown parameter."""
        before = set(before)
        new = {k: v for k, v in ns.items() if k not in before and not k.startswith("_")}
        return self.validate(new)

    def describe(self) -> str:
        return "\n".join(f"  {p.name}: {p.allowed()}  {p.help}" for p in self.params.values())


def profile_path(profile: str) -> Path:
    """``"ci"`` → ``params/ci.yaml``; a path to an existing YAML file is taken as it is."""
    p = Path(profile)
    if p.suffix in (".yaml", ".yml"):
        if not p.exists():
            raise ParamError(f"parameter file {str(p)!r} does not exist")
        return p
    q = PROFILE_DIR / f"{profile}.yaml"
    if not q.exists():
        have = sorted(x.stem for x in PROFILE_DIR.glob("*.yaml"))
        raise ParamError(f"unknown profile {profile!r}: no file {q}; profiles: {have}")
    return q


def profile_name(profile: str) -> str:
    return Path(profile).stem


def load_profile(profile: str, section: str) -> dict[str, Any]:
    """The parameters of one notebook (``section``) in a profile file, with ``profile`` set to its name."""
    path = profile_path(profile)
    try:
        data = yaml.load(path.read_text(), Loader=_NoDatesSafeLoader) or {}
    except yaml.YAMLError as err:
        raise ParamError(f"parameter file {path} is not valid YAML ({_yaml_reason(err)})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ParamError(f"parameter file {path} cannot be read ({err})") from None
    if not isinstance(data, dict):
        raise ParamError(f"parameter file {path} must map notebook names to sections, not a {type(data).__name__}")
    if section not in data:
        raise ParamError(f"{path} has no section {section!r}; sections: {sorted(map(str, data))}")
    sec = data[section]
    if sec is not None and not isinstance(sec, dict):
        raise ParamError(f"section {section!r} of {path} must be a mapping of parameter names to values, "
                         f"not a {type(sec).__name__} ({sec!r})")
    out = dict(sec or {})
    out.setdefault("profile", profile_name(profile))
    return out
