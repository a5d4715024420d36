"""What `attnrepro check` judges a run against: a git revision (default HEAD; in CI the merge base with the
pull request's base branch). It supplies claims.yaml, the predicates (src/attnrepro/judge/conclusions.py,
executed from the revision's text: never the working tree's module), params.yaml, the reference metrics
(metrics/*.json), their seed distributions (metrics/dist/), machine records (metrics/env/) and verdicts
(metrics/claims.json). The working tree supplies only the run's outputs: claims, predicates or params
edited there are listed (`claims_changes`, `params_changes`), never used to judge."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from attnrepro.config import UserError
from attnrepro.files import parse_json
from attnrepro.judge.claims import CONCLUSIONS, METRIC_FILES_EXCLUDED, Expectations, Tol, load
from attnrepro.judge.endpoints import parts
from attnrepro.provenance.lock import METRICS, key_leaves, short
from attnrepro.stats import flatten


# ---------------------------------------------------------------- the revision

class Unreadable(UserError):
    """A committed file of the reference that cannot be read (bytes that are not UTF-8): the check fails naming it."""


class Revision:
    """Files as committed at a git revision: `rev`, or with `base` the merge base of HEAD and `base`."""

    def __init__(self, rev: str, root: Path, base: Optional[str] = None):
        self.root = root
        flag, asked = ("--base", base) if base is not None else ("--rev", rev)
        try:
            self.commit = self._git("rev-parse", "--verify", "--quiet", f"{asked}^{{commit}}").strip()
        except UserError:
            raise UserError(f"{flag}: {asked!r} is not a commit in {root.resolve()}") from None
        self.name = self.label = rev  # name: in the lines of the output; label: in the verdict
        if base is not None:
            try:
                self.commit = self._git("merge-base", "HEAD", self.commit).strip()
            except UserError:
                raise UserError(f"--base: HEAD and {base} have no commit in common") from None
            self.name = self.commit[:10]
            self.label = f"{self.name}, the merge base of HEAD and {base}"

    def _git(self, *args) -> str:
        p = subprocess.run(["git", "-C", str(self.root), *args], capture_output=True)
        if p.returncode != 0:
            err = p.stderr.decode("utf-8", "replace").strip().splitlines()
            raise UserError(f"git {' '.join(args)}: {err[-1] if err else 'failed'}")
        return p.stdout.decode("utf-8", "replace")

    def files(self, folder: str) -> list[str]:
        return sorted(n for n in self._git("ls-tree", "--name-only", self.commit, f"{folder}/").split("\n")
                      if n.endswith(".json"))

    def show(self, path: str) -> str:
        """A committed file's text; bytes that are not UTF-8 are Unreadable, naming the file and the line they are
        on (never replaced: an endpoint's name with a bad byte would read as another, missing metric)."""
        p = subprocess.run(["git", "-C", str(self.root), "show", f"{self.commit}:{path}"], capture_output=True)
        if p.returncode != 0:
            raise UserError(f"{self.name} has no {path}")
        try:
            return p.stdout.decode("utf-8")
        except UnicodeDecodeError as e:
            line = p.stdout[:e.start].count(b"\n")
            text = p.stdout.split(b"\n")[line].decode("utf-8", "replace").strip()
            raise Unreadable(f"{self.name}:{path} cannot be read: not UTF-8 text at line {line + 1} "
                             f"({short(text, 60)})") from None

    def text_or_none(self, path: str) -> Optional[str]:
        """A committed file's text, None where the revision has no such file."""
        if path not in self._git("ls-tree", "--name-only", self.commit, path).split("\n"):
            return None
        return self.show(path)

    def json(self, path: str):
        return parse_json(self.show(path), f"{self.name}:{path}")

    def yaml(self, path: str) -> dict:
        """A committed YAML file ({} where the revision has none)."""
        try:
            text = self.show(path)
        except UserError:
            return {}
        try:
            return yaml.safe_load(text) or {}
        except yaml.YAMLError as e:
            raise UserError(f"{self.name}:{path} is not valid YAML ({str(e).splitlines()[0]})") from None

    def expectations(self, path: str) -> Expectations:
        """claims.yaml and the predicates beside it as committed."""
        text = self.show(path)
        preds = (Path(path).parent / CONCLUSIONS).as_posix()
        try:
            code = self._git("show", f"{self.commit}:{preds}")
        except UserError:
            raise UserError(f"{self.name} has no {preds} (the predicates of its conclusions): it cannot be the "
                            "reference of this version of the check") from None
        return load(f"{self.name}:{path}", code, f"{self.name}:{preds}", text=text)

    def changed_since(self, paths: list[str]) -> list[str]:
        """The files among `paths` that HEAD's commits change since this revision (a pull request's changes)."""
        return [n for n in self._git("diff", "--name-only", self.commit, "HEAD", "--", *paths).split("\n") if n]


@dataclass
class Reference:
    label: str  # how the verdict names the revision
    name: str  # how the other lines name it
    metrics: dict  # flat <file>.<key> -> number
    dists: dict  # file -> {"stats", "runs"}
    envs: dict  # file -> machine record
    params: dict
    verdicts: dict  # claim id -> its verdict on the reference (metrics/claims.json)
    expectations: Expectations  # its claims.yaml


GPU_FILES = ("latency", "kv_cache")  # the stages scripts/gpu_check.sh runs on CUDA


def device_slug(gpu_name: str) -> str:
    """The folder of a GPU's reference, metrics/gpu/<slug>/ (as scripts/gpu_check.sh names it)."""
    return re.sub(r"[^a-z0-9]+", "-", gpu_name.lower()).strip("-") or "unknown-gpu"


def reference(r: Revision, claims_path: str, run_envs: Optional[dict] = None) -> Reference:
    """The reference at revision r. Where the run made a GPU_FILES stage on a CUDA device (its machine
    record, `run_envs`) whose GPU reference the revision holds (metrics/gpu/<slug>/<stage>.json and
    env_<stage>.json, as scripts/gpu_check.sh writes them), that stage is judged against it instead."""
    metrics, dists, envs = {}, {}, {}
    held = r.files(METRICS)
    for name in held:
        stem = Path(name).stem
        if stem not in METRIC_FILES_EXCLUDED:
            metrics.update(flatten(r.json(name), f"{stem}."))
    for name in r.files(f"{METRICS}/dist"):
        dists[Path(name).stem] = r.json(name)
    for name in r.files(f"{METRICS}/env"):
        envs[Path(name).stem] = r.json(name)
    for stem in GPU_FILES:
        env = (run_envs or {}).get(stem) or {}
        if not (str(env.get("device", "")).startswith("cuda") and env.get("gpu_name")):
            continue
        folder = f"{METRICS}/gpu/{device_slug(env['gpu_name'])}"
        gpu = r.files(folder)
        if f"{folder}/{stem}.json" in gpu and f"{folder}/env_{stem}.json" in gpu:
            metrics = {k: v for k, v in metrics.items() if not k.startswith(f"{stem}.")}
            metrics.update(flatten(r.json(f"{folder}/{stem}.json"), f"{stem}."))
            envs[stem] = r.json(f"{folder}/env_{stem}.json")
    verdicts = r.json(f"{METRICS}/claims.json") if f"{METRICS}/claims.json" in held else {}
    return Reference(r.label, r.name, metrics, dists, envs, r.yaml("params.yaml"), verdicts, r.expectations(claims_path))


def unreadable(ref: Reference) -> list[str]:
    """A primary endpoint or checksum the reference names but whose metric its own metrics lack (a missing key,
    a name damaged in its claims.yaml): a problem, never an endpoint quietly not judged."""
    named = [("primary endpoint", k) for e in ref.expectations.primary for k in parts(e.metric)]
    named += [("checksum", c.metric) for c in ref.expectations.claims if c.cls == "checksum" and c.metric]
    return [f"{what} {metric}: named by {ref.name}'s claims.yaml, but {ref.name}'s metrics have no such value: the "
            "reference cannot be read" for what, metric in named if metric not in ref.metrics]


# ---------------------------------------------------------------- what the working tree changes

_RANK = {"exact": 0, "eps": 1, "abs": 2, "rel": 2, "factor": 2, "info": 3}


def looser(a: Optional[Tol], b: Optional[Tol]) -> Optional[bool]:
    """Is tolerance b looser than a? None where they cannot be ordered (±x against ±x%)."""
    a, b = a or Tol("exact"), b or Tol("exact")
    if a.kind == b.kind:
        return b.amount > a.amount
    return None if _RANK[a.kind] == _RANK[b.kind] else _RANK[b.kind] > _RANK[a.kind]


def _tol(t: Optional[Tol]) -> str:
    return (t or Tol("exact")).text()


def _shape(c) -> tuple:
    """What a claim asserts, besides its class and tolerance (its text and notes aside)."""
    return (c.metric, c.code, c.published, c.requires, c.fieller, c.match.rows if c.match else None, c.own)


def claims_changes(ref: Expectations, tree: Expectations) -> dict[str, dict[str, list[str]]]:
    """How the working tree's claims differ from the reference's, per file: {"claims.yaml": {loosened,
    removed, added, changed}, CONCLUSIONS: {...}} (a predicate's code compared as ast: comments, layout
    and its text aside; a conclusion made a value, or a predicate newly skipped on a kind of device, is loosened)."""
    old, new = {c.id: c for c in ref.claims}, {c.id: c for c in tree.claims}
    out: dict[str, list[str]] = {"loosened": [], "removed": sorted(set(old) - set(new)),
                                 "added": sorted(set(new) - set(old)), "changed": []}
    for cid in sorted(set(old) & set(new)):
        a, b = old[cid], new[cid]
        if a.cls != b.cls:
            out["loosened" if b.cls == "value" else "changed"].append(f"{cid} ({a.cls} -> {b.cls})")
        elif a.tol != b.tol:
            out["loosened" if looser(a.tol, b.tol) else "changed"].append(f"{cid} ({_tol(a.tol)} -> {_tol(b.tol)})")
        if b.requires is not None and a.requires != b.requires:  # now skipped on (other) devices
            out["loosened"].append(f"{cid} (requires {a.requires or 'nothing'} -> {b.requires})")
        elif _shape(a) != _shape(b):
            what = a.source or a.metric, b.source or b.metric
            out["changed"].append(cid if what[0] == what[1] else f"{cid} ({short(what[0], 40)} -> {short(what[1], 40)})")
    predicate = {c.id for c in (*ref.claims, *tree.claims) if c.predicate is not None}
    order = ("loosened", "removed", "added", "changed")
    files = {f: {k: [] for k in order} for f in ("claims.yaml", CONCLUSIONS)}
    for what, items in out.items():
        for item in items:
            files[CONCLUSIONS if item.split(" ", 1)[0] in predicate else "claims.yaml"][what].append(item)
    out = files["claims.yaml"]
    for what in ("timings", "gpu_only"):  # a glob added there takes metrics out of the gate
        a, b = getattr(ref, what), getattr(tree, what)
        out["loosened"] += [f'{what} "{g}"' for g in b if g not in a]
        out["changed"] += [f'{what} "{g}" removed' for g in a if g not in b]
    da, db = {r.glob: r.tol for r in ref.drift}, {r.glob: r.tol for r in tree.drift}
    for g, t in db.items():
        if g not in da or t != da[g]:
            worse = g not in da and t.kind != "exact" or g in da and looser(da[g], t)
            out["loosened" if worse else "changed"].append(f'drift "{g}" ({_tol(da.get(g)) if g in da else "new"} -> '
                                                           f'{_tol(t)})')
    out["changed"] += [f'drift "{g}" removed' for g in da if g not in db]
    def order(rules, others):  # first match wins: the order of the rules of one metrics file
        return sorted((g.split(".")[0], i, g) for i, g in enumerate(g for g in rules if g in others))

    if [(f, g) for f, _, g in order(da, db)] != [(f, g) for f, _, g in order(db, da)]:
        out["changed"].append("drift rules reordered")
    pa, pb = ({e.metric: e for e in x.primary} for x in (ref, tree))
    out["loosened"] += [f"primary {m} removed" for m in pa if m not in pb]
    out["loosened"] += [f"primary {m} margin {pa[m].text} -> {pb[m].text}" for m in pa
                        if m in pb and pb[m].margin > pa[m].margin]
    out["changed"] += [f"primary {m} margin {pa[m].text} -> {pb[m].text}" for m in pa
                       if m in pb and pb[m].margin < pa[m].margin]
    out["added"] += [f"primary {m}" for m in pb if m not in pa]
    return {f: {k: v for k, v in d.items() if v} for f, d in files.items() if any(d.values())}


def params_changes(ref: dict, tree: dict) -> list[str]:
    """`key old -> new` for each params leaf that differs."""
    a, b = key_leaves(ref), key_leaves(tree)
    return [f"{'.'.join(k)} {short(a.get(k))} -> {short(b.get(k))}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]
