"""What `attnrepro check` judges a run against, and whether the run's files are still the run.

The reference is a git revision (default HEAD; in CI the merge base with the pull request's
base branch). It supplies claims.yaml, the predicates (src/attnrepro/judge/conclusions.py, executed
from the revision's text: never the working tree's module), params.yaml, the reference metrics
(metrics/*.json), their seed distributions (metrics/dist/), machine records (metrics/env/) and
verdicts (metrics/claims.json). The working tree supplies only the run's outputs: claims,
predicates or params edited there are listed (`claims_changes`, `params_changes`), never used
to judge.

The run's own record is dvc.lock: every output of the pipeline's stages that git holds (metrics/,
plots/, report/) with its md5 (a directory's as DVC computes it, `out_md5`) and every param value
each stage ran with. A file or param that differs from it was edited after the run (`lock_findings`).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

from attnrepro.config import UserError
from attnrepro.files import dvc_stages, parse_json, read_yaml_or_none
from attnrepro.judge.claims import CONCLUSIONS, METRIC_FILES_EXCLUDED, METRICS, ClaimError, Expectations, Tol, load
from attnrepro.stats import flatten


# ---------------------------------------------------------------- the revision

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
        try:
            return self._git("show", f"{self.commit}:{path}")
        except UserError:
            raise UserError(f"{self.name} has no {path}") from None

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
        """claims.yaml and the predicates beside it as committed (claims.load reads claims.yaml from a
        file: the revision's text, in a temporary one; the predicates from the revision's text)."""
        text = self.show(path)
        preds = (Path(path).parent / CONCLUSIONS).as_posix()
        try:
            code = self._git("show", f"{self.commit}:{preds}")
        except UserError:
            raise UserError(f"{self.name} has no {preds} (the predicates of its conclusions): it cannot be the "
                            "reference of this version of the check") from None
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d) / Path(path).name
            tmp.write_text(text, encoding="utf-8")
            try:
                return load(tmp, code, f"{self.name}:{preds}")
            except ClaimError as e:
                raise ClaimError(str(e).replace(str(tmp), f"{self.name}:{path}")) from None

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
    return (c.metric, c.code, c.published, c.requires, c.interval, c.match.rows if c.match else None, c.own)


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


def key_leaves(d, path: tuple = ()) -> dict[tuple, object]:
    """{path of keys: value} of every leaf (a key may hold dots: a file name)."""
    if isinstance(d, dict) and d:
        out = {}
        for k, v in d.items():
            out.update(key_leaves(v, path + (str(k),)))
        return out
    return {path: d}


def short(v, width: int = 24) -> str:
    s = "—" if v is None else json.dumps(v, ensure_ascii=False) if isinstance(v, (list, dict)) else str(v)
    return s if len(s) <= width else s[:width - 1] + "…"


def params_changes(ref: dict, tree: dict) -> list[str]:
    """`key old -> new` for each params leaf that differs."""
    a, b = key_leaves(ref), key_leaves(tree)
    return [f"{'.'.join(k)} {short(a.get(k))} -> {short(b.get(k))}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]


def listed(items: list[str], n: int = 6) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


# ---------------------------------------------------------------- the run's record: dvc.lock

def file_md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def out_md5(path: Path) -> str:
    """The md5 DVC 3 records for an output: a file's bytes; for a directory, the md5 of its manifest
    (sorted [{"md5", "relpath"}] as JSON) followed by ".dir"."""
    if not path.is_dir():
        return file_md5(path)
    manifest = sorted(({"md5": file_md5(f), "relpath": f.relative_to(path).as_posix()}
                       for f in path.rglob("*") if f.is_file()), key=lambda e: e["relpath"])
    return hashlib.md5(json.dumps(manifest, sort_keys=True).encode("utf-8")).hexdigest() + ".dir"


_NUMBER = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_BOOL = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}


def norm_param(v):
    """A params value as YAML 1.2 (DVC) reads it: PyYAML (1.1) leaves '-1.0e4' a string and reads 'on' as true."""
    if isinstance(v, dict):
        return {k: norm_param(x) for k, x in v.items()}
    if isinstance(v, list):
        return [norm_param(x) for x in v]
    if isinstance(v, str) and _NUMBER.fullmatch(v):
        return float(v)
    if isinstance(v, str) and v.lower() in _BOOL:
        return _BOOL[v.lower()]
    return v


def get_leaf(d, path: tuple):
    for part in path:
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


def lock_findings(root: Path, reference_lock: Optional[dict] = None) -> tuple[list[str], list[str]]:
    """(problems, notes): each metrics/, plots/ and report/ output (what git holds) and each param that differs from what dvc.lock
    recorded for the stages of dvc.yaml (a stale lock entry of a stage dvc.yaml no longer has is ignored),
    and each metrics file no stage recorded, are problems; except that a param only stages that were not
    rerun ran with another value of (their lock entry, outputs and params, is the reference's own, and
    their outputs are intact) is a note where the new value was run: a thread count (a setting of the
    machine, not of the protocol), or a param another stage ran with at its new value (`dvc exp run -S
    failures.steps=600 failures` leaves the sweeps that declare `failures` so; `dvc status` lists them
    stale). A param edit no stage ran with stays a problem: nothing committed follows params.yaml."""
    if not (root / "dvc.lock").is_file():
        return ["dvc.lock is missing: the outputs cannot be matched with the run that made them"], []
    lock = read_yaml_or_none(root / "dvc.lock")
    if not isinstance(lock, dict):
        return ["dvc.lock is not valid YAML: the outputs cannot be matched with the run that made them"], []
    stages, trees = dvc_stages(root, required=False), {}
    current = {n: st for n, st in (lock.get("stages") or {}).items()
               if n in stages}
    problems, notes, recorded, params_seen, ran_with_now = [], [], set(), {}, {}
    theirs = (reference_lock or {}).get("stages") or {}
    not_rerun = {n for n, st in current.items()
                 if n in theirs and (st.get("outs"), st.get("params")) == (theirs[n].get("outs"), theirs[n].get("params"))}
    for name, st in current.items():
        for out in st.get("outs") or []:
            path = str(out.get("path", ""))
            recorded.add(path)
            if not (path == "report" or path.startswith((f"{METRICS}/", "plots/", "report/"))):  # git holds these
                continue
            if not (root / path).exists():
                problems.append(f"{path} is missing (dvc.lock records it as an output of {name})")
                not_rerun.discard(name)
            elif out_md5(root / path) != out.get("md5"):
                problems.append(f"{path} was edited after the run (its md5 differs from dvc.lock's)")
                not_rerun.discard(name)
        for file, values in (st.get("params") or {}).items():
            tree = trees[file] if file in trees else trees.setdefault(file, read_yaml_or_none(root / file) or {})
            for key, ran in (values or {}).items():  # key: a dotted path (DVC's), its value a leaf or a mapping
                for leaf, v in key_leaves(ran, tuple(str(key).split("."))).items():
                    if norm_param(get_leaf(tree, leaf)) != norm_param(v):
                        params_seen.setdefault((file, ".".join(leaf), short(v), short(get_leaf(tree, leaf))),
                                               []).append(name)
                    else:
                        ran_with_now.setdefault((file, ".".join(leaf)), []).append(name)
    for (file, leaf, ran, now), names in params_seen.items():
        run_now = ran_with_now.get((file, leaf), [])
        if all(n in not_rerun for n in names) and (leaf.rsplit(".", 1)[-1] == "threads" or run_now):
            notes.append(f"{file} {leaf} was edited after the run ({listed(names, 3)} ran with {ran}, it now reads "
                         f"{now}), and {'it was' if len(names) == 1 else 'they were'} not rerun: the outputs are "
                         "the reference's own (`dvc status` lists them stale)"
                         + (f"; {listed(run_now, 3)} ran with {now}" if run_now else ""))
        else:
            problems.append(f"{file} {leaf} was edited after the run ({listed(names, 3)} ran with {ran}, it now "
                            f"reads {now})")
    for f in sorted(p for sub in ("", "dist/", "env/") for p in (root / METRICS).glob(f"{sub}*.json")):
        rel = f.relative_to(root).as_posix()
        if rel not in recorded and not any(rel.startswith(r + "/") for r in recorded):
            problems.append(f"{rel} is an output of no stage in dvc.lock: not made by the run")
    return problems, notes
