"""Move run store entries to the current key (`attnrepro store migrate`), training nothing.

An entry records the key material it was made from (spec.json). Migration re-keys it
from that record: the recorded spec, read into today's typed RunSpec, the recorded
input hashes and torch version, and the numerics version it was made under. Only an
entry whose numerics version is the task's current one moves; any other stays where no
key of this code looks (`attnrepro store gc --legacy` removes what nothing can use).

Entries made before numerics versions were keyed by a digest of the code's bytes. The
digests below are the code that numerics version 1 is: the commit whose outputs the
golden tests (tests/golden/) and the committed reference were made by.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import typing
from dataclasses import dataclass, field

from attnrepro.config import ConfigError
from attnrepro.model.transformer import ModelConfig
from attnrepro.run.execute import NUMERICS, TASKS, spec_from_material
from attnrepro.run.spec import RunSpec
from attnrepro.staging import remove_path
from attnrepro.store.run_store import MANIFEST, Damaged, OldFormat, RunStore, key_of, spec_record, verify_entry

# sha256 over runs.COMMON_CODE and the task's modules at commit 372ac46 -> its numerics version
VERSION_OF_CODE = {
    "corpus_lm": {"1d2185c73afc0cfd09c9aba9c25f4c063e35a0614bc81710948c808d7c709bbb": 1},
    "charlm": {"a1d906cb4e7e9385aad96d3a9562f864b874651d278bcc5c01e5d6bedfe64ccc": 1},
    "reversal": {"7dcdd5fcc1962a8dadde6203befdc3f326278974146ecdff1ce5507c9aa7909a": 1},
}


@dataclass
class Migration:
    moved: int = 0
    current: int = 0  # already under their current key
    other_version: int = 0  # made by code of another numerics version (or an unknown digest): left in place
    damaged: list[tuple[str, str]] = field(default_factory=list)  # left for the next sweep to quarantine

    def line(self) -> str:
        return (f"store migrate: {self.moved} re-keyed, {self.current} already current, {self.other_version} "
                f"of another numerics version left as they are, {len(self.damaged)} damaged or legacy skipped")


# what a corpus_lm measurement left out meant before every field was stated
LEGACY_MEASURE = {"summary_steps": [], "diagnostics": False, "qk_scale": False, "symptoms": False, "sample": None}


def _legacy_material(material: dict) -> dict:
    """Records before numerics versions went through the metrics rounding, which writes booleans as
    0 and 1: give the fields typed bool their booleans back; and a corpus_lm measurement then named
    only what it switched on (LEGACY_MEASURE: the rest). Nothing else differs."""
    def fix(cls, d):
        if not isinstance(d, dict):
            return d
        hints = typing.get_type_hints(cls)
        out = dict(d)
        for f in dataclasses.fields(cls):
            if f.name in out and hints[f.name] is bool and out[f.name] in (0, 1):
                out[f.name] = bool(out[f.name])
        return out

    task = TASKS.get(material.get("task"))
    m = fix(RunSpec, material)
    m["model"] = fix(ModelConfig, m.get("model"))
    if task is not None and task.measure is not None and isinstance(m.get("measure"), dict):
        m["measure"] = fix(task.measure, {**LEGACY_MEASURE, **m["measure"]})
    return m


def numerics_of(record: dict) -> int | None:
    """The numerics version an entry's spec.json says it was made under (None: unknown code)."""
    if "numerics" in record:
        return record["numerics"]
    task = record.get("spec", {}).get("task")
    return VERSION_OF_CODE.get(task, {}).get(record.get("code"))


def migrate(store: RunStore, progress=lambda i, n: None) -> Migration:
    out = Migration()
    entries = store.entries()
    for i, path in enumerate(entries):
        progress(i + 1, len(entries))
        try:
            with contextlib.suppress(OldFormat):  # raised last: its files match its manifest, its spec re-keys it
                verify_entry(path, full=True)
            record = json.loads((path / "spec.json").read_text(encoding="utf-8"))
            task = record["spec"]["task"]
            version = numerics_of(record)
            if task not in NUMERICS or version != NUMERICS[task]:
                out.other_version += 1
                continue
            material = record["spec"] if "numerics" in record else _legacy_material(record["spec"])
            spec = spec_from_material(material, record.get("label", ""))
        except (Damaged, OSError, KeyError, ValueError, ConfigError) as e:
            out.damaged.append((path.name, str(e) or type(e).__name__))
            continue
        doc = {"spec": spec.key_material(), "inputs": record["inputs"], "numerics": version,
               "torch": record["torch"]}
        key = key_of(doc)
        if key == path.name and record.get("key") == key:
            out.current += 1
            continue
        files = {p.name: p.read_bytes() for p in sorted(path.iterdir()) if p.name != MANIFEST}
        files["spec.json"] = spec_record(doc, key, spec.label)
        store.put(key, files)
        if store.path(key) != path:
            remove_path(path)
        out.moved += 1
    return out

