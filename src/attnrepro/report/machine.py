"""The machine records in the report: the machine in one line (`machine_line`) and every stage's
environment record, compacted (`env_markdown`)."""

from __future__ import annotations

from attnrepro.formatting import md_table, table_cell


def _short(key: str, v) -> str:
    """An environment value as a table shows it: git revisions cut to 7 characters, sizes in GiB."""
    if key == "git_revision" and isinstance(v, str) and len(v) > 7:
        return v[:7]
    return _env_value(key, v)


def env_markdown(envs: dict[str, dict]) -> str:
    """The machine records of every stage, compacted: what all stages share in one table, then only
    the fields that differ, one row per stage (git revisions cut to 7 characters)."""
    if not envs:
        return "No environment records (metrics/env/*.json) were found.\n"
    stages = sorted(envs)
    keys = sorted({k for e in envs.values() for k in e})
    same = [k for k in keys if len({repr(envs[s].get(k)) for s in stages}) == 1]
    differ = [k for k in keys if k not in same]
    out = [f"Shared by all {len(stages)} stages ({', '.join(stages)}):\n"]
    out += md_table(["field", "value"],
                    [[k, table_cell(_short(k, envs[stages[0]].get(k)) if envs[stages[0]].get(k) is not None else "—")]
                     for k in same])
    if differ:
        out += ["", "Fields that differ between stages:\n"]
        out += md_table(["stage", *differ],
                        [[s, *("—" if envs[s].get(k) is None else table_cell(_short(k, envs[s][k])) for k in differ)]
                         for s in stages])
    return "\n".join(out) + "\n"


def _common(envs: dict[str, dict], key: str):
    """The value most stages record for `key` (ties: the smallest repr), and the stages that differ."""
    vals = {s: _short(key, e[key]) for s, e in envs.items() if e.get(key) is not None}  # as shown
    if not vals:
        return None, []
    tally: dict[str, int] = {}
    for v in vals.values():
        tally[v] = tally.get(v, 0) + 1
    best = min(tally, key=lambda r: (-tally[r], r))
    value = next(envs[s][key] for s, v in sorted(vals.items()) if v == best)
    return value, sorted(s for s, v in vals.items() if v != best)


def machine_line(envs: dict[str, dict]) -> str:
    """The machine in one line: CPU, cores, RAM, device, torch and its threads, Python, numpy (the
    value most stages record; stages that differ named in brackets)."""
    if not envs:
        return "not recorded (no metrics/env/*.json)"

    def part(key: str, fmt) -> str:
        v, odd = _common(envs, key)
        if v is None:
            return ""
        extra = "; ".join(f"{s}: {_short(key, envs[s][key])}" for s in odd)
        return fmt(v) + (f" ({extra})" if extra else "")

    cuda, _ = _common(envs, "cuda_available")
    items = [part("cpu", str), part("cpu_capability", str), part("cpu_cores_logical", lambda v: f"{v} logical cores"),
             part("ram_bytes", lambda v: f"{_env_value('ram_bytes', v)} RAM"),
             "no CUDA" if not cuda else part("cuda_version", lambda v: f"CUDA {v}"),
             part("torch", lambda v: f"torch {v}"), part("torch_threads", lambda v: f"{v} torch thread(s)"),
             part("python", lambda v: f"Python {v}"), part("numpy", lambda v: f"numpy {v}")]
    return ", ".join(i for i in items if i)


def _env_value(key: str, v) -> str:
    if key.endswith("_bytes") and isinstance(v, (int, float)):
        return f"{v / 2**30:.1f} GiB"
    return str(v)
