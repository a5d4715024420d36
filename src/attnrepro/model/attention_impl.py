"""The attention-implementation setting (params `attention.impl`): the one place a user's attention
function is loaded (importlib), checked, and called under a time limit.

A target is `package.module:function` (attributes may be dotted: `module:Class.method`) with
the signature of torch.nn.functional.scaled_dot_product_attention. The current directory is
put on sys.path first, as `python -m` does, so a module of the working tree imports. Its
identity (the dotted path and a SHA-256 of its source file) keys training runs, so runs of
two implementations, or of two versions of one file, never share a run-store entry.

Every problem a user can cause is one UserError line: a path that does not import, an
object that is not callable, another signature, a call that raises or returns the wrong
shape on a small input, a call that does not return within the time limit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import math
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from attnrepro.config import UserError, require

SDPA_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale")
BUILTIN = ("", "builtin")  # params values meaning the project's own attention
SMOKE_SECONDS = 60.0


class AuditTimeout(UserError):
    """The callable did not return within the time limit."""


@dataclass(frozen=True)
class Target:
    spec: str  # package.module:function as the user wrote it
    fn: Callable
    source: str  # the file it is defined in ("" when it has none, e.g. a builtin)
    sha256: str  # of that file's bytes ("" when it has none)

    @property
    def identity(self) -> str:
        """`spec@<first 16 hex digits of the source's SHA-256>`: what keys a run of this implementation."""
        return f"{self.spec}@{self.sha256[:16]}" if self.sha256 else self.spec


def _import(module: str, spec: str):
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise UserError(f"{spec}: module {e.name!r} not found (run from the folder that holds the package, "
                        "or install it)") from None
    except Exception as e:  # a module that fails while importing
        raise UserError(f"{spec}: importing {module} raised {type(e).__name__}: {e}") from None


def _source(obj) -> tuple[str, str]:
    try:
        path = inspect.getsourcefile(inspect.unwrap(obj)) or ""
    except TypeError:  # builtins and C functions have no source file
        path = ""
    if not path or not Path(path).is_file():
        return "", ""
    return path, hashlib.sha256(Path(path).read_bytes()).hexdigest()


def check_signature(fn: Callable, spec: str) -> None:
    """It must accept SDPA's arguments by these names (or take **kwargs)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a C function without introspectable signature (e.g. F.scaled_dot_product_attention's kin)
    try:
        sig.bind(torch.empty(0), torch.empty(0), torch.empty(0), attn_mask=None, dropout_p=0.0, is_causal=False,
                 scale=None)
    except TypeError as e:
        raise UserError(f"{spec}: signature {sig} does not take scaled_dot_product_attention's arguments "
                        f"({', '.join(SDPA_PARAMS)}): {e}") from None


def resolve(spec: str, interface: str = "sdpa") -> Target:
    """The callable `spec` names, checked to be callable with SDPA's signature; with interface
    "project", a function with the project's interface adapted to it (project_interface)."""
    require(interface in ("sdpa", "project"), "--interface", interface, "sdpa or project")
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise UserError(f"{spec!r}: expected package.module:function "
                        "(e.g. examples.attention.chunked:chunked_attention)")
    obj = _import(module, spec)
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{spec}: {module} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise UserError(f"{spec}: {type(obj).__name__} object is not callable")
    path, sha = _source(obj)
    if interface == "project":
        return Target(spec, project_interface(obj), path, sha)
    check_signature(obj, spec)
    return Target(spec, obj, path, sha)


def resolve_identity(identity: str) -> Target:
    """The target of an identity string (`spec@sha16`), refusing a source file that changed since."""
    spec, _, sha = identity.rpartition("@") if "@" in identity else (identity, "", "")
    target = resolve(spec)
    if sha and target.sha256[:16] != sha:
        raise UserError(f"{spec}: its source {target.source} changed since this run was keyed "
                        f"(sha256 {target.sha256[:16]}, expected {sha}); rerun training with the new file")
    return target


def call_with_limit(fn: Callable, seconds: float, what: str, *args, **kwargs):
    """fn(*args, **kwargs) in a daemon thread; AuditTimeout when it has not returned after `seconds`.

    Python cannot kill a thread: a hung call is abandoned (it dies with the process), which is
    why a timeout ends the audit instead of going on beside it."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as e:  # re-raised in the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, daemon=True, name=f"audit:{what}")
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise AuditTimeout(f"{what}: no result within {seconds:g} s (the time limit per check, --time-limit)")
    if "error" in box:
        raise box["error"]
    return box["value"]


def smoke(target: Target, seconds: float, device: str = "cpu") -> None:
    """One small call, before any check: it must return a tensor of SDPA's shape and dtype."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, n, 8, generator=g).to(device) for n in (5, 7, 7))
    what = f"{target.spec} on a (2, 3, 5, 8) query"
    try:
        out = call_with_limit(target.fn, seconds, what, q, k, v)
    except AuditTimeout:
        raise
    except Exception as e:
        raise UserError(f"{what} raised {type(e).__name__}: {e}") from None
    if not isinstance(out, torch.Tensor):
        raise UserError(f"{what} returned {type(out).__name__}, expected a tensor")
    if tuple(out.shape) != (2, 3, 5, 8):
        raise UserError(f"{what} returned shape {tuple(out.shape)}, expected (2, 3, 5, 8)")


def project_interface(fn: Callable) -> Callable:
    """Adapt a function with the project's interface (attnrepro.model.attention.attention: q, k, v, *,
    scaled, causal -> AttentionResult or tensor) to SDPA's signature. It can express only
    scale None (scaled) or 1 (unscaled) and a causal mask with L == S; other cases raise
    NotImplementedError, which the audit reports as unsupported, not failed."""

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        if attn_mask is not None or dropout_p:
            raise NotImplementedError("the project's interface takes no attn_mask or dropout")
        if is_causal and query.shape[-2] != key.shape[-2]:
            raise NotImplementedError("the project's causal mask aligns bottom-right; SDPA's top-left")
        if scale is not None and not math.isclose(scale, 1.0):
            raise NotImplementedError("the project's interface scales by 1/sqrt(d) or not at all")
        out = fn(query, key, value, scaled=scale is None, causal=is_causal)
        return getattr(out, "out", out)

    return sdpa


@dataclass
class AttentionConfig:
    """params `attention`: the attention implementation the model trains and is probed with."""
    impl: str  # "" or "builtin": attnrepro.model.attention; else package.module:function with SDPA's signature

    def validate(self, prefix: str = "attention") -> None:
        if self.impl not in BUILTIN:
            try:
                smoke(resolve(self.impl), SMOKE_SECONDS)
            except UserError as e:
                raise UserError(f"{prefix}.impl: {e}") from None

    def model_impl(self, current: str = "manual") -> str:
        """ModelConfig.impl under this setting: `current` for the builtin, else the callable's identity."""
        return current if self.impl in BUILTIN else resolve(self.impl).identity

    def apply(self, spec):
        """A RunSpec whose model uses this implementation (the builtin: the spec itself, unchanged)."""
        if self.impl in BUILTIN:
            return spec
        impl = self.model_impl(spec.model.impl)
        return dataclasses.replace(spec, model=dataclasses.replace(spec.model, impl=impl))

    def check_checkpoint(self, model_impl: str, key: str) -> None:
        """A probe's checkpoint must have been trained with this implementation (rerun train otherwise)."""
        want = self.model_impl(model_impl if model_impl == "manual" else "manual")
        if model_impl != want:
            raise UserError(f"{key}: trained with attention {model_impl!r}, but attention.impl gives {want!r} "
                            "(rerun the train stage)")
