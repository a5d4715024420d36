"""What dvc.yaml and dvc.lock record of the run: the stages upstream of each metrics file, the params each
stage ran with (against another lock's), and every output git holds against its md5 (`lock_findings`).
A file or param that differs from dvc.lock was edited after the run."""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path
from typing import Optional

from attnrepro.files import dvc_entry, dvc_stages, read_yaml_or_none

METRICS = "metrics"  # the metrics folder, as dvc.yaml's outputs name it


def same(a, b) -> bool:
    """Equal, nan equal to nan (a metric that is nan on both runs has not moved)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


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


def listed(items: list[str], n: int = 6) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def _resolve(text: str, params: dict) -> str:
    """dvc.yaml templating: ${a.b} from params (left as is when params lack it)."""
    def look(m):
        v = params
        for k in m.group(1).split("."):
            v = v.get(k) if isinstance(v, dict) else None
        return m.group(0) if v is None or isinstance(v, (dict, list)) else str(v)
    return re.sub(r"\$\{([^}]+)\}", look, text)


def dist_producers(root: Path) -> dict[str, str]:
    """{seed distribution's file stem: the metrics file of the stage that writes it} (dvc.yaml)."""
    out = {}
    for st in dvc_stages(root, required=False).values():
        paths = [dvc_entry(o)[0] for k in ("outs", "metrics") for o in st.get(k) or []]
        own = [Path(p).stem for p in paths if p.startswith(f"{METRICS}/") and p.count("/") == 1]
        for p in paths:
            if p.startswith(f"{METRICS}/dist/") and own:
                out[Path(p).stem] = own[0]
    return out


def file_stages(root: Path, params: dict) -> dict[str, set[str]]:
    """{metrics file: its stage and the stages upstream of it} (dvc.yaml)."""
    stages = dvc_stages(root, required=False)
    outs, deps = {}, {}
    for name, st in stages.items():
        outs[name] = [dvc_entry(o)[0] for k in ("outs", "metrics", "plots") for o in st.get(k) or []]
        deps[name] = [_resolve(dvc_entry(d)[0], params) for d in st.get("deps") or []]

    def upstream(name, seen):
        for other, paths in outs.items():
            if other not in seen and any(d == p or d.startswith(p + "/") for d in deps[name] for p in paths):
                seen.add(other)
                upstream(other, seen)
        return seen

    out: dict[str, set[str]] = {}
    for name in stages:
        for p in outs[name]:
            if p.startswith("metrics/") and p.endswith(".json") and p.count("/") == 1:
                out[Path(p).stem] = upstream(name, {name})
    return out


def made_with_other_params(root: Path, params: dict, reference_lock: dict, reference_params: dict) -> dict[str, list[str]]:
    """{metrics file: the params sections its stage, or a stage upstream of it, ran with otherwise than the
    reference's run of that stage}, read from the two dvc.lock files: the params the outputs were made with,
    never an edit of params.yaml no stage ran with. Only params.yaml's leaves, dotted keys split as nested
    ones; a leaf one lock lacks (a key added to a stage's params, an entry absent) counts with that
    revision's params.yaml value. A thread count is the machine's (torch_threads in the records), not the
    protocol's: a run on 2 threads keeps its float-order tolerances."""
    lock = read_yaml_or_none(root / "dvc.lock")
    lock = lock if isinstance(lock, dict) else {}

    def ran(d: dict, stage: str) -> dict:
        got = ((((d.get("stages") or {}).get(stage) or {}).get("params") or {}).get("params.yaml") or {})
        return {leaf: norm_param(v) for key, val in got.items()
                for leaf, v in key_leaves(val, tuple(str(key).split("."))).items()}

    differ: dict[str, set[str]] = {}
    out = {}
    for file, stages in file_stages(root, params).items():
        sections = set()
        for st in stages:
            if st not in differ:
                a, b = ran(lock, st), ran(reference_lock, st)
                differ[st] = {k[0] for k in set(a) | set(b) if k and k[-1] != "threads"
                              and a.get(k, norm_param(get_leaf(params, k)))
                              != b.get(k, norm_param(get_leaf(reference_params, k)))}
            sections |= differ[st]
        out[file] = sorted(sections)
    return out


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
