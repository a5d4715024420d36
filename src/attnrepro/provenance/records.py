"""The runs behind the metrics: the run folders a stage keeps against dvc.lock (`run_folder_findings`) and
against the metrics and the run store (`run_record_findings`), the run store's
summaries of the train and failures runs (`store_findings`), the sweeps made again from the store, training
nothing (`sweep_findings`), and the numerics each stage's runs were keyed under (`made_by`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Mapping

from attnrepro.config import from_dict
from attnrepro.experiments.failures import FailuresConfig
from attnrepro.experiments.protocol import CORPUS_FILES, TrainConfig, corpus_inputs
from attnrepro.files import dvc_entry, dvc_stages, read_json, read_yaml_or_none
from attnrepro.formatting import fmt_number
from attnrepro.provenance.lock import METRICS, out_md5, same
from attnrepro.run.execute import NUMERICS, run_key
from attnrepro.run.stage import is_sweep
from attnrepro.store.run_store import RunStore, recorded_key
from attnrepro.stats import flatten

RUN_FILES = ("train", "failures")  # the stages whose metrics are seeded runs of the store (what --decide reruns)


MACHINE = ("cpu", "cpu_capability", "device", "torch")  # a run's numbers are comparable where these agree


def run_config(params: Mapping, file: str):
    return from_dict(TrainConfig if file == "train" else FailuresConfig, params[file], prefix=file)


def run_folder_findings(root: Path, params: Mapping, reference_lock: Mapping) -> list[str]:
    """The run folders a stage keeps (dvc.lock's outputs data/<stage>, the corpus aside: git ignores them)
    against dvc.lock: a folder present must have the md5 dvc.lock records, and (train) each variant's run a
    folder of its own. A folder absent is a problem where its stage's lock entry is not the reference's (the
    stage ran, or its record was rewritten, since): an untouched checkout, where nothing ran, has none."""
    lock = read_yaml_or_none(root / "dvc.lock")
    stages = (lock.get("stages") or {}) if isinstance(lock, dict) else {}
    theirs = (reference_lock or {}).get("stages") or {}
    problems = []
    for name in sorted(set(stages) | set(theirs)):
        st = stages.get(name) or {}
        recorded = {str(o.get("path", "")) for e in (st, theirs.get(name) or {}) for o in e.get("outs") or []}
        for path in [f"data/{name}"] if f"data/{name}" in recorded and name != "corpus" else []:
            folder = root / path
            if not folder.is_dir():
                if st != theirs.get(name):
                    problems.append(f"{path} is missing, but dvc.lock records {name} as run since the reference: "
                                    "its runs' folders cannot be matched with its metrics")
                continue
            runs = list((params.get(name) or {}).get("variants") or {}) if name == "train" else []  # one folder each
            gone = [r for r in runs if not (folder / r).is_dir()]
            if gone:
                problems.append(f"{path}/{gone[0]} is missing: the run behind {METRICS}/{name}.json {gone[0]} is gone")
            elif out_md5(folder) != next((o.get("md5") for o in st.get("outs") or [] if o.get("path") == path), None):
                problems.append(f"{path} differs from dvc.lock (its md5): its runs' folders were changed after the run")
    return problems


def run_record_findings(root: Path, params: Mapping) -> list[str]:
    """The metrics of a stage that keeps its runs' folders (data/<stage>/<name>/: spec.json and
    summary.json, as the run store wrote them) against those records: each folder's spec.json must
    hash to its key, and every number its summary shares with metrics/<stage>.json[<name>] must be
    the same; and the folder's summary must be the one the run store (params engine.store) keeps under
    that key, where it holds it, made on the same machine. A metric edited together with dvc.lock (and the
    folder) is caught here; without data/ (not pulled, not rerun) there is nothing to read."""
    problems = []
    store = RunStore(root / str((params.get("engine") or {}).get("store", "runs")), say=lambda line: None)
    for folder in sorted((root / "data").glob("*/*/")):
        stage, name = folder.parent.name, folder.name
        if not ((folder / "summary.json").is_file() and (folder / "spec.json").is_file()):
            continue
        where = f"data/{stage}/{name}"
        record = read_json(folder / "spec.json")
        if recorded_key(record) != record.get("key"):
            problems.append(f"{where}/spec.json does not hash to its key: the run's record was edited")
            continue
        summary = read_json(folder / "summary.json")
        metrics_file = root / METRICS / f"{stage}.json"
        mine = read_json(metrics_file).get(name) if metrics_file.is_file() else None
        bad = [(key, mine[key], recorded) for key, recorded in sorted(summary.items())
               if isinstance(mine, dict) and key in mine and not same(mine[key], recorded)]
        problems += [f"{METRICS}/{stage}.json {name}.{key} = {fmt_number(value)}, but the run that made it ({where}, "
                     f"run {record['key'][:12]}) recorded {fmt_number(recorded)}" for key, value, recorded in bad]
        kept = store.path(record["key"])  # the next link, where the first holds: the run store's entry of the run
        if bad or store.link_on_way(kept) is not None or not (kept / "summary.json").is_file() or \
                _read_or_none(kept / "env.json") != _read_or_none(folder / "env.json"):
            continue
        stored = read_json(kept / "summary.json")
        problems += [f"{where}/summary.json {key} = {fmt_number(summary.get(key))}, but the run store's entry of its "
                     f"run ({record['key'][:12]}) recorded {fmt_number(stored.get(key))}: the run folder was edited"
                     for key in sorted(set(summary) | set(stored)) if not same(summary.get(key), stored.get(key))]
    return problems


def _read_or_none(path: Path):
    return read_json(path) if path.is_file() else None


def made_by(envs: dict[str, dict]) -> tuple[list[str], list[str]]:
    """Which code made each stage's results (its environment record): the revision, whether it had
    uncommitted changes, and the numerics versions its runs were keyed under. A result whose runs
    were keyed under other numerics than the code at HEAD declares (run.execute.NUMERICS) is not the code at
    HEAD's: a problem. Returns (lines, problems)."""
    made: dict[str, list[str]] = {}
    problems = []
    for file, env in sorted(envs.items()):
        rev = env.get("git_revision")
        who = "an unknown revision" if not rev else rev[:10] + (" with uncommitted changes" if env.get("git_dirty") else "")
        made.setdefault(who, []).append(file)
        used = env.get("numerics") or {}
        moved = {t: (v, NUMERICS.get(t)) for t, v in used.items() if NUMERICS.get(t) != v}
        if moved:
            problems.append(f"metrics/{file}.json comes from runs keyed under other numerics than the code at HEAD's ("
                            + ", ".join(f"{t}: {a} -> {b}" for t, (a, b) in moved.items())
                            + "): its results are not this code's; `dvc repro` retrains them")
    lines = [f"made by {who}: {', '.join(files)}" for who, files in made.items()]
    return lines, problems


def store_findings(root: Path, params: Mapping, metrics: Mapping[str, float], dists: Mapping[str, dict],
                   envs: Mapping[str, dict], producers: Mapping[str, str]) -> list[str]:
    """Each seed's runs of metrics/dist/<file>.json (made by the stage producers[file]), and the run
    seed's metrics/<file>.json, for RUN_FILES, against the summary the run store (params engine.store) keeps
    under the run's key, recomputed from params, the device the stage ran on and the corpus: every number
    both hold must be equal. Compared only where the run was made on the machine the stage's record names
    (MACHINE): a store filled elsewhere holds other float orders under the same keys. Runs the store does
    not hold are not read; nothing is moved."""
    engine = params.get("engine") or {}
    store = RunStore(root / str(engine.get("store", "runs")), say=lambda line: None)
    corpus = root / "data" / "corpus"
    if not store.root.is_dir() or not all((corpus / n).is_file() for n in CORPUS_FILES):
        return []
    inputs = corpus_inputs(corpus)
    problems = []
    for file in RUN_FILES:
        seeds = [int(x) for x in (dists.get(file) or {}).get("seeds", [])]
        device = (envs.get(file) or {}).get("device")
        if not seeds or file not in params or not device:
            continue
        cfg = run_config(params, file)
        for seed in seeds:
            for variant in cfg.variants:
                key = run_key(cfg.spec(variant, seed, device), inputs)
                summary = store.path(key) / "summary.json"
                if store.link_on_way(summary) is not None or not summary.is_file():
                    continue  # (a link is never followed: `store verify` names it)
                ran_on_file = summary.with_name("env.json")  # an entry without one: its machine unknown, not read
                recorded, ran_on = read_json(summary), read_json(ran_on_file) if ran_on_file.is_file() else {}
                mine = [(f"metrics/dist/{file}.json seed {seed} {variant}", producers.get(file, file),
                         (dists[file]["runs"].get(str(seed)) or {}).get(variant) or {})]
                if seed == cfg.seed and not (root / "data" / file / variant / "summary.json").is_file():
                    # (a run folder the stage keeps is read by run_record_findings already)
                    mine.append((f"metrics/{file}.json {variant}", file, {k[len(f"{file}.{variant}."):]: v for k, v
                                                                         in metrics.items()
                                                                         if k.startswith(f"{file}.{variant}.")}))
                for where, stage, values in mine:
                    if any(ran_on.get(k) != (envs.get(stage) or {}).get(k) for k in MACHINE):
                        continue
                    bad = sorted(k for k, v in recorded.items() if k in values and not same(values[k], v))
                    problems += [f"{where}: {k} = {fmt_number(values[k])}, but the run that made it (store "
                                 f"{key[:12]}) recorded {fmt_number(recorded[k])}" for k in bad]
    return problems


def sweep_findings(root: Path, params: Mapping, envs: Mapping[str, dict], live: Callable[[str], dict],
                   say: Callable[[str], None] = lambda line: None) -> tuple[list[str], list[str]]:
    """(problems, notes): each sweep stage (run.stage.SWEEPS, choices@<arm> included) whose machine record
    names this machine (MACHINE) and whose runs it made here is run again in a scratch folder from the run
    store with --store-only (a run the store lacks stops it: a note, not a problem), and every number of
    its metrics/*.json and every byte of its CSVs compared with the working tree's. Nothing in the
    working tree is written and nothing trains (the scratch folder is removed; the store is read as any
    stage reads it, so an entry found damaged is quarantined)."""
    root = root.resolve()  # the scratch folder links to it
    store = (root / str((params.get("engine") or {}).get("store", "runs"))).resolve()
    problems: list[str] = []
    notes: list[str] = []
    if not store.is_dir():
        return problems, notes
    elsewhere = []
    for name, st in dvc_stages(root).items():
        outs = [dvc_entry(o)[0] for o in st.get("outs") or []]
        env_file = next((o for o in outs if o.startswith("metrics/env/")), None)
        env = envs.get(Path(env_file).stem) if env_file else None
        if not is_sweep(name) or not env:
            continue
        if env.get("runs_on") != "this machine" or \
                any(env.get(k) != live(str(env.get("device", "cpu"))).get(k) for k in MACHINE):
            elsewhere.append(name)
            continue
        with tempfile.TemporaryDirectory(prefix="attnrepro-remake-") as tmp:
            scratch = Path(tmp)
            made, why = _remake(root, scratch, st, store)
            if not made:
                notes.append(f"{name}: not made again from the run store ({why})")
                continue
            say(f"check: {name} made again from the run store (no training); comparing")  # said only once it was
            files = [f.relative_to(root).as_posix() for o in outs if not o.startswith("metrics/env/")
                     for f in ([root / o] if (root / o).is_file() else sorted((root / o).rglob("*")))]
            for out in files:
                mine, again = root / out, scratch / out
                if not mine.is_file() or not again.is_file():
                    continue
                if out.endswith(".json"):
                    a, b = flatten(read_json(mine)), flatten(read_json(again))
                    bad = sorted(k for k in set(a) | set(b) if not same(a.get(k), b.get(k)))
                    problems += [f"{out}: {k} = {fmt_number(a.get(k))}, but made again from the run store's records "
                                 f"it is {fmt_number(b.get(k))}" for k in bad[:3]]
                    if len(bad) > 3:
                        problems.append(f"{out}: and {len(bad) - 3} more numbers differ from the ones made again "
                                        "from the run store")
                elif out.endswith(".csv") and mine.read_bytes() != again.read_bytes():
                    problems.append(f"{out} differs from the one made again from the run store's records")
    if elsewhere:
        notes.append(f"{', '.join(elsewhere)}: made on another machine than this one, so not made again from this "
                     "run store (its float order differs)")
    return problems, notes


def _remake(root: Path, scratch: Path, stage: Mapping, store: Path) -> tuple[bool, str]:
    """Run `stage`'s command in `scratch` (its code and read-only inputs linked, the files it reads
    under metrics/ and plots/ copied) with the run store at `store`, --store-only."""
    for part in ("src", "stages", "scripts"):
        (scratch / part).symlink_to(root / part)
    for f in ("params.yaml", "dvc.yaml"):
        shutil.copy(root / f, scratch / f)
    for dep in (dvc_entry(d)[0] for d in stage.get("deps") or []):
        src, dst = root / dep, scratch / dep
        if dep.split("/")[0] in ("src", "stages", "scripts") or not src.exists() or dst.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dep.startswith(("metrics/", "plots/")):
            (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)
        else:
            dst.symlink_to(src)
    words = str(stage["cmd"]).split()
    script = next(i for i, w in enumerate(words) if w.startswith("stages/"))
    cmd = [sys.executable, *words[script:], "--store", str(store), "--store-only", "--workers", "1"]
    proc = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(root / "src")})
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return False, lines[-1].removeprefix("error: ") if lines else f"exit {proc.returncode}"
    return True, ""
