"""Typed, strictly validated stage configuration loaded from params.yaml.

Every stage reads its own section into a dataclass. Unknown keys, wrong types and
out-of-range values are rejected before any work starts, with one line naming the
key, the value and what was expected.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any, Literal, TypeVar, get_args, get_origin

T = TypeVar("T")


class UserError(Exception):
    """A problem the user can fix (bad params, bad input data); reported in one line."""


class ConfigError(UserError, ValueError):
    """A params value is wrong; the message names the key and what was expected."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are UserErrors: one line "error: <prog>: <what>" and exit 2,
    like every other bad input (subcommand parsers inherit it)."""

    def error(self, message: str):
        raise UserError(f"{self.prog}: {message} (see {self.prog} --help)")


def _type_name(tp) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(tp))
    if origin in (list, tuple):
        (inner, *_) = get_args(tp) or (Any,)
        return f"a list of {_type_name(inner)}"
    if origin is dict or tp is dict:
        return "a mapping"
    if origin is typing.Union:
        return " or ".join(_type_name(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string"}.get(
        tp, getattr(tp, "__name__", str(tp))
    )


def _coerce(value, tp, key: str):
    """Return `value` checked against type `tp`, or raise ConfigError naming `key`."""
    origin = get_origin(tp)
    bad = ConfigError(f"{key}: got {value!r}, expected {_type_name(tp)}")
    if tp is Any:
        return value
    if origin is typing.Union:
        for alt in get_args(tp):
            try:
                return _coerce(value, alt, key)
            except ConfigError:
                pass
        raise bad
    if tp is type(None):
        if value is None:
            return None
        raise bad
    if origin is Literal:
        if value in get_args(tp) and not isinstance(value, bool):
            return value
        raise bad
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise bad
        (inner,) = get_args(tp)[:1] or (Any,)
        items = [_coerce(v, inner, f"{key}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(value, dict):
            raise bad
        kt, vt = get_args(tp) or (Any, Any)
        return {_coerce(k, kt, key): _coerce(v, vt, f"{key}.{k}") for k, v in value.items()}
    if tp in (dict, list):
        if isinstance(value, tp):
            return value
        raise bad
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise bad
        return from_dict(tp, value, prefix=key)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise bad
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise bad
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML reads "3e-3" as a string
            try:
                return float(value)
            except ValueError:
                raise bad from None
        raise bad
    if tp is str:
        if isinstance(value, str):
            return value
        raise bad
    raise TypeError(f"unsupported config type {tp!r} for {key}")


def from_dict(cls: type[T], data: dict, prefix: str) -> T:
    """Build dataclass `cls` from `data`; reject unknown and missing keys."""
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix}: expected a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{prefix}.{unknown[0]}: unknown key (known keys: {', '.join(sorted(fields))})"
        )
    kwargs = {}
    for name, f in fields.items():
        key = f"{prefix}.{name}"
        if name in data:
            kwargs[name] = _coerce(data[name], hints[name], key)
            _check_bounds(name, kwargs[name], key)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{key}: missing (expected {_type_name(hints[name])})")
    obj = cls(**kwargs)
    check = getattr(obj, "validate", None)
    if check is not None:
        check(prefix)
    return obj


# Bounds every section shares, by field name. Seeds: torch.manual_seed takes [-2^63, 2^64) and
# numpy's default_rng any integer >= 0; negative seeds are refused (torch would wrap -1 to 2^64 - 1:
# two keys for one run) and the top is 2^63 - 1, so seeds derived by adding a small offset stay valid.
SEED_MAX = 2**63 - 1
MAX_STEPS = 10_000_000  # over a day at 10 ms a step; a typo of a few zeros stops here, not after hours


def _check_bounds(name: str, value, key: str) -> None:
    if name == "steps" and isinstance(value, int):
        require(value <= MAX_STEPS, key, value, f"at most {MAX_STEPS:,} steps")
    seeds = [value] if name.endswith("seed") else value if name.endswith("seeds") else []
    for i, s in enumerate(seeds if isinstance(seeds, (list, tuple)) else []):
        if isinstance(s, int):
            require(0 <= s <= SEED_MAX, key if name.endswith("seed") else f"{key}[{i}]", s,
                    "a seed in [0, 2^63 - 1] (no negative seeds)")


def require(cond: bool, key: str, value, expected: str) -> None:
    """Raise a one-line ConfigError unless `cond` holds."""
    if not cond:
        raise ConfigError(f"{key}: got {value!r}, expected {expected}")


def require_positive(obj, names, prefix: str) -> None:
    """require() each of the integer fields `names` of `obj` to be > 0."""
    for name in names:
        require(getattr(obj, name) > 0, f"{prefix}.{name}", getattr(obj, name), "a positive integer")
