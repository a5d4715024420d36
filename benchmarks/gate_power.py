"""Benchmark: which plausible bugs `attnrepro check` catches (issue 18, "gate power, measured").

Each case is a copy of the repository at the reference revision (a git worktree in a temporary
folder) with one change committed on it, rerun under another float order on the stages the
change reaches, then judged by `attnrepro check --rev <reference> --json`, as a pull request
would be:

- a **mutant** is a small bug a contributor could introduce (attention, model, init, optimizer,
  schedule, data split, tokenizer), a one-line text replacement that must match the code exactly
  once. Each says what we expect of it before it runs: `harmful` (the gate must fail it) or
  `harmless` (its effect should lie within seed noise; if the gate passes it, `--seeds` shows
  whether that holds).
- a **faithful** rerun changes only how the run executes (the vector instructions, worker
  processes), never what it computes: the gate must pass it.

Every case trains from a run store of its own, never holding the reference's runs (a mutant that
moves numbers but keeps its run keys would otherwise be served them): empty and temporary, or with
--decide (hours a case) kept in .gate_power_stores/ so that a stopped case resumes where it stopped.
It runs on 2 worker processes, under another float order without touching params (a params edit
would leave every stage not rerun "edited after the run"): torch, MKL and oneDNN are limited to AVX2
(or to no vector instructions), as on another CPU; the env records say so and the check judges the
rerun stages statistically. Besides the check, each case runs the golden tests
(tests/test_golden.py), the guard a pull request meets in CI before any result is regenerated.

A case reruns, in order, the stages of the default pipeline its change reaches (the sweeps,
seeds, critical, qknorm and sensitivity, and kv_cache and latency are never rerun: they keep the
reference's outputs and can only pass, so the matrix measures the power of what is rerun), is
judged after the stages up to train, and only if it passes there after the rest too. The
reference itself must pass its own check first, or every case fails. A stage that will not finish because runs
diverge or crash under the change fails the gate; any other failure (DVC, data, the machine)
is an ERROR, never counted as caught. Prints a confusion matrix (expected x verdict, ERROR
apart), per case the checks that caught it (golden test, dvc.lock or records, checksum,
conclusion, primary endpoint, train metric, other metric, or failed metrics: init statistics
only) and its cost, and writes
benchmarks/results/gate_power.json (a --stages trial writes gate_power.trial.json).

    python benchmarks/gate_power.py [--cases a,b,...] [--rev REV] [--keep] [--list] [--decide [MAX_SEEDS]]
    python benchmarks/gate_power.py --seeds 5 --cases <a mutant the gate passed>

With --decide, each case is then judged by `attnrepro check --decide` too (its results' `decide`: the looks,
the endpoints' answers, the seeds and CPU time; `decided` says what issue 42 asks of each kind of case), also
where a stage after train failed (`check_after_train`: the check's verdict before it): the endpoints' stages
finished.

The second form trains the mutant's four train variants at the first 5 seeds of seeds.seeds
and compares each gated train metric with the reference's runs at the same seeds (paired
differences in reference seed sd, 90% t intervals (an intersection-union test), Holm's p): "moved" (an effect the
gate missed), "harmless" (every interval within one seed sd: shown within noise, a finding)
or "inconclusive" (N seeds cannot tell either way); a mutant the same way against the faithful avx2
rerun at the same seeds (the same float order, so that only the code differs); and how many seeds a
case with no effect at all would need to show each metric within one seed sd, from the spread of its
paired differences (a faithful rerun's figures say what showing "harmless" costs). Figures, not
asserts; hours of CPU (each case about 15-25 minutes on 2 cores; the --seeds form about 55-80 minutes
per case on 2 free cores, twice that for the first mutant at seeds the avx2 control has not run at:
its runs are trained too). The --seeds form keeps its runs in
.gate_power_stores/ (git-ignored), one run store per reference and case definition, so a stopped
comparison resumes where it stopped.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import fnmatch
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from attnrepro.envinfo import cpu_model
from attnrepro.files import write_text  # atomic: a kill mid-write never leaves hours of results half-written
from attnrepro.stats import LOOKS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "gate_power.json"
DATA_DIR = ROOT / "data"  # what each case's data/ starts as (--data)
CASE_STORES = ROOT / ".gate_power_stores"  # --seeds and --decide runs, kept so that a stopped case resumes
# the stages a change reaches, train first: a case is judged after the stages up to train, and only if it
# passes there after the rest too (a caught mutant costs no more than its train runs)
TRAINING = ("init_sweep", "train", "heads", "failures", "reversal", "charlm")
ATTENTION = ("precision", "init_sweep", "train", "heads", "failures", "reversal", "charlm")
DATA = ("corpus", "train", "heads", "failures")


@dataclass(frozen=True)
class Case:
    name: str
    area: str
    expect: str  # harmful | harmless | faithful
    why: str
    path: str = ""  # the file a mutant edits ...
    old: str = ""  # ... the text it replaces (exactly once) ...
    new: str = ""  # ... and with what
    stages: tuple[str, ...] = TRAINING
    isa: str = "AVX2"  # the float order: the vector instructions torch and MKL may use (another CPU)
    workers: int = 2
    first: str = "changed"  # the declared answer to "same computation?" (--first): changed | unchanged
    # the declared answer to "does it still reproduce the chapter?" (claims.yaml's primary endpoints, the chapter's
    # contrasts, within 10 rerun seeds): DIFFERENT (it breaks an effect beyond its margin) | not DIFFERENT; why
    second: tuple[str, str] = ("not DIFFERENT", "the change reaches no contrast the endpoints read, or moves the "
                               "scaled and unscaled arms alike")


MUTANTS = [
    Case("scale_by_d", "attention", "harmful", "1/d instead of 1/sqrt(d): logits 5.7x (d 32) to 16x (d 256) too small",
         "src/attnrepro/model/attention.py", "        scores = scores / math.sqrt(d)\n", "        scores = scores / d\n",
         ATTENTION, second=("DIFFERENT", "the scaled arms alone change: their attention near uniform, so the gaps and "
                                         "the collapse ratios move")),
    Case("scale_by_d_model", "attention", "harmful",
         "sqrt(d_model) for sqrt(d_head): only the 4-head small model changes (1/sqrt(128) for 1/sqrt(32))",
         "src/attnrepro/model/attention.py", "    d = q.shape[-1]\n", "    d = q.shape[-1] * q.shape[1]\n", ATTENTION),
    Case("mask_sees_next", "attention", "harmful", "off-by-one causal mask: each query sees the next key (a leak)",
         "src/attnrepro/model/attention.py", "    return j <= i + offset\n", "    return j <= i + offset + 1\n", ATTENTION,
         second=("DIFFERENT", "a model that sees the next token copies it: the losses and their gaps collapse toward 0")),
    Case("softmax_no_max", "attention", "harmful",
         "softmax without subtracting the row max: unscaled d 256 logits reach the hundreds and overflow",
         "src/attnrepro/model/attention.py", "        e = torch.exp(scores - scores.amax(dim=-1, keepdim=True))\n",
         "        e = torch.exp(scores)\n", ATTENTION,
         second=("DIFFERENT", "the unscaled d_head-256 logits in the hundreds overflow: its loss and diagnostics NaN")),
    Case("layernorm_eps", "model", "harmless", "LayerNorm eps 1e-6 for 1e-5 in the first norm of each block",
         "src/attnrepro/model/transformer.py", "        self.ln1 = nn.LayerNorm(d)\n", "        self.ln1 = nn.LayerNorm(d, eps=1e-6)\n"),
    Case("gelu_tanh", "model", "harmless", "the tanh approximation of GELU (max difference ~1e-3)",
         "src/attnrepro/model/transformer.py", "act = nn.GELU() if", "act = nn.GELU(approximate=\"tanh\") if"),
    Case("no_final_layernorm", "model", "harmful", "the final LayerNorm skipped before the output head",
         "src/attnrepro/model/transformer.py", "logits = self.head(self.ln_f(x))", "logits = self.head(x)"),
    Case("resid_init_unscaled", "init", "harmful",
         "residual projections at init_std instead of init_std/sqrt(2 n_layer) (a factor 2 at 2 layers)",
         "src/attnrepro/model/transformer.py", "std / math.sqrt(2 * self.cfg.n_layer) if", "std if"),
    Case("adam_default_betas", "optimizer", "harmful", "AdamW's default betas (0.9, 0.999) for §1.18.3's (0.9, 0.95)",
         "src/attnrepro/run/loop.py", "betas=tuple(cfg.betas))", "betas=(0.9, 0.999))"),
    Case("decay_2d_only", "optimizer", "harmless",
         "weight decay on 2-D weights only (the pre-issue-17 protocol; the old sensitivity sweep moved only ||W_qkv||_F)",
         "src/attnrepro/run/loop.py", "    if cfg.decay == \"2d\":\n", "    if cfg.decay in (\"2d\", \"all\"):\n"),
    Case("no_grad_clip", "optimizer", "harmful", "gradient clipping dropped (§1.18.3's grad_clip 1.0)",
         "src/attnrepro/run/loop.py",
         "max_norm = cfg.grad_clip if cfg.grad_clip is not None else math.inf",
         "max_norm = math.inf"),
    Case("warmup_off_by_one", "schedule", "harmless", "warm-up from lr 0 at step 0 (step/warmup for (step+1)/warmup)",
         "src/attnrepro/run/loop.py", "return cfg.lr * (step + 1) / cfg.warmup", "return cfg.lr * step / cfg.warmup"),
    Case("cosine_to_zero", "schedule", "harmful", "cosine to 0 instead of §1.18.3's 0.1 lr floor",
         "src/attnrepro/run/loop.py", "    floor = cfg.min_lr_ratio\n", "    floor = 0.0\n"),
    Case("targets_two_ahead", "data", "harmful", "targets shifted by 2 instead of 1 (predict the token after next)",
         "src/attnrepro/run/loop.py", "y = self.tokens[starts[:, None] + offsets + 1]",
         "y = self.tokens[starts[:, None] + offsets + 2]",
         second=("DIFFERENT", "another task: every loss rises, and the gap attention makes at d_head 256 with it")),
    Case("val_first", "data split", "harmful", "validation = the first tenth of the stream instead of the last",
         "src/attnrepro/data/corpus.py",
         "return tok, {\"train\": ids[: len(ids) - n_val], \"val\": ids[len(ids) - n_val :]}, metrics",
         "return tok, {\"train\": ids[n_val:], \"val\": ids[:n_val]}, metrics", DATA),
    Case("newline_counted", "tokenizer", "harmful",
         "newline counted into the vocabulary (the pre-issue-17 rule): newline ranks second, so 1197 of the 1198 "
         "kept characters change id or drop out and the <unk> rate falls from 0.189 to 0.116 (first declared "
         "harmless, relabelled before any run once measured)",
         "src/attnrepro/data/tokenizer.py", "counts = Counter(text if count_newline else text.replace(\"\\n\", \"\"))",
         "counts = Counter(text)", DATA),
    # issue 62: the classes the matrix lacked (evaluation, data pipeline, checkpoint, generation), declared
    # before any run
    Case("val_half_batches", "evaluation", "harmful", "the validation loss over the first half of its fixed batches",
         "src/attnrepro/model/transformer.py", "losses = [model(x, y)[1].item() for x, y in batches]",
         "losses = [model(x, y)[1].item() for x, y in batches[: max(1, len(batches) // 2)]]"),
    Case("val_batches_train_seed", "data pipeline", "harmful",
         "the validation batches drawn with the training batches' seed instead of val_seed",
         "src/attnrepro/run/task_lm.py", "spec.data.val_batches, seed=spec.data.val_seed)",
         "spec.data.val_batches, seed=spec.batch_seed)"),
    Case("checkpoint_drops_ln_f", "checkpoint", "harmful",
         "a loaded checkpoint keeps the fresh final LayerNorm (its weights are not restored)",
         "src/attnrepro/model/transformer.py", "model.load_state_dict(ckpt[\"state_dict\"])",
         "model.load_state_dict({k: v for k, v in ckpt[\"state_dict\"].items() if not k.startswith(\"ln_f\")}, "
         "strict=False)"),
    Case("kv_positions_restart", "generation", "harmful",
         "with a KV cache each new token is given position 0 onwards again instead of its place after the cache",
         "src/attnrepro/model/transformer.py", "start = kv_caches[0].length if kv_caches else 0", "start = 0"),
]

FAITHFUL = [
    Case("avx2", "float order", "faithful", "the same code on a CPU with AVX2 only (another reduction order)",
         first="unchanged"),
    Case("no_simd", "float order", "faithful", "the same code without vector instructions (yet another order)",
         isa="DEFAULT", first="unchanged"),
    Case("avx2_serial", "engine", "faithful", "AVX2, the runs one after the other (another schedule)",
         workers=1, first="unchanged"),
    Case("mkl_sse42", "float order", "faithful", "ATen's AVX2 kernels with MKL limited to SSE4.2 (an order the "
         "float-order profile did not calibrate on, unlike avx2)", isa="AVX2_MKL_SSE4_2", first="unchanged"),
]

CASES = {c.name: c for c in MUTANTS + FAITHFUL}


# ---------------------------------------------------------------- one case

def sh(cmd: list[str], cwd: Path, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} (in {cwd}): exit {p.returncode}\n{p.stderr[-2000:]}")
    return p


def apply(case: Case, tree: Path) -> None:
    """The mutant's replacement (exactly once), or nothing for a faithful rerun."""
    if not case.path:
        return
    f = tree / case.path
    text = f.read_text(encoding="utf-8")
    n = text.count(case.old)
    if n != 1:
        raise SystemExit(f"mutant {case.name}: {case.path} holds its text {n} times, expected once "
                         "(the code changed: update the mutant)")
    f.write_text(text.replace(case.old, case.new), encoding="utf-8")


def isa_env(isa: str) -> dict:
    """Environment that makes this machine compute like one with `isa` (AVX2, DEFAULT: none): ATen's kernels
    (torch.backends.cpu.get_cpu_capability(), recorded in the env records, so the check sees another machine)
    and MKL's and oneDNN's."""
    if isa == "AVX2_MKL_SSE4_2":
        return {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    return {"ATEN_CPU_CAPABILITY": isa.lower(), "MKL_ENABLE_INSTRUCTIONS": "SSE4_2" if isa == "DEFAULT" else isa,
            "ONEDNN_MAX_CPU_ISA": "SSE41" if isa == "DEFAULT" else isa}


def set_params(tree: Path, settings: dict) -> None:
    """{"section.key": value} written line by line as DVC's writer would (and checked by parsing)."""
    p = tree / "params.yaml"
    params, text = yaml.safe_load(p.read_text(encoding="utf-8")), p.read_text(encoding="utf-8")
    for dotted, value in settings.items():
        section, key = dotted.split(".")
        params[section][key] = value
        text = _set_line(text, section, key, value)
    if yaml.safe_load(text) != params:
        raise RuntimeError(f"could not set {settings} in params.yaml line by line")
    p.write_text(text, encoding="utf-8")


def _set_line(text: str, section: str, key: str, value) -> str:
    """Replace `  key: ...` under the top-level `section:` (keeping the line's comment)."""
    lines, inside = text.split("\n"), False
    for i, line in enumerate(lines):
        if not line.startswith(" ") and line.strip():
            inside = line.startswith(f"{section}:")
        elif inside and line.startswith(f"  {key}:"):
            comment = line[line.index("#"):] if "#" in line else ""
            lines[i] = f"  {key}: {json.dumps(value)}" + (f"  {comment}" if comment else "")
            while i + 1 < len(lines) and lines[i + 1].startswith("  - "):  # a block list's items
                del lines[i + 1]
            return "\n".join(lines)
    raise KeyError(f"{section}.{key}")


class CaseTree:
    """The repository at `rev` in a temporary worktree with the case applied and committed, its own
    run store (empty and temporary unless `store` names one the case's runs alone went to), the case's
    float order and `extra` params (`seeds`: its reference seeds, in order); removed on exit unless `keep`."""

    def __init__(self, case: Case, rev: str, keep: bool, extra: dict | None = None, store: Path | None = None):
        self.case, self.rev, self.keep, self.extra, self.store = case, rev, keep, extra or {}, store

    def __enter__(self) -> "CaseTree":
        self.tmp = Path(tempfile.mkdtemp(prefix=f"gate_power_{self.case.name}_"))
        self.tree = self.tmp / "repo"
        sh(["git", "worktree", "add", "--detach", str(self.tree), self.rev], ROOT)
        apply(self.case, self.tree)
        self.seeds = yaml.safe_load((self.tree / "params.yaml").read_text(encoding="utf-8"))["seeds"]["seeds"]
        set_params(self.tree, {"engine.store": str(self.store or self.tmp / "store"), "engine.workers": self.case.workers,
                               **self.extra})
        sh(["git", "-c", "user.name=gate_power", "-c", "user.email=gate_power@localhost", "commit", "-qam",
            f"gate_power: {self.case.name}"], self.tree)
        # the corpus arrays and the raw corpus come from this checkout, not from a fetch
        shutil.copytree(DATA_DIR, self.tree / "data", dirs_exist_ok=True)
        # scripts/py runs the stages with this interpreter, importing the case's own code
        inherited = {k: v for k, v in os.environ.items() if k not in ("ATTNREPRO_SCHEDULER", "ATTNREPRO_WORKERS")}
        self.env = {**inherited, "PYTHONPATH": str(self.tree / "src"), "ATTNREPRO_PYTHON": sys.executable,
                    **isa_env(self.case.isa)}  # local workers only: a scheduler's workers would not have the ISA
        return self

    def repro(self, stages) -> tuple[dict, str]:
        """Rerun `stages` in order: (seconds per stage, the first stage that failed or "")."""
        seconds = {}
        for stage in stages:
            t = time.perf_counter()
            p = sh([sys.executable, "-m", "dvc", "repro", "--force", "--single-item", stage], self.tree, self.env,
                   check=False)
            seconds[stage] = round(time.perf_counter() - t, 1)
            if p.returncode != 0:
                tail = p.stderr.strip().splitlines()[-15:]
                if "Traceback (most recent call last)" in p.stderr and not any("Traceback" in x for x in tail):
                    tail.insert(0, "Traceback (most recent call last): ...")  # what stage_failure reads
                self.error = "\n".join(tail) or "(no output)"
                return seconds, stage
        return seconds, ""

    def check(self, code: Path | None = None, extra: tuple[str, ...] = ()) -> dict:
        """`attnrepro check --rev <reference>` on the tree, with the case's own checker or `code`'s (a src/)."""
        env = {**self.env, "PYTHONPATH": str(code)} if code else self.env
        chk = sh([sys.executable, "-m", "attnrepro.commands.main", "check", "--rev", self.rev, "--json", *extra],
                 self.tree, env, check=False)
        try:
            return json.loads(chk.stdout)
        except json.JSONDecodeError:
            return {"verdict": "ERROR", "problems": [chk.stderr.strip()[-500:]]}

    def __exit__(self, *exc) -> None:
        if self.keep:
            print(f"  kept {self.tree}", flush=True)
        else:
            sh(["git", "worktree", "remove", "--force", str(self.tree)], ROOT, check=False)
            shutil.rmtree(self.tmp, ignore_errors=True)


FIRST_RESULTS = ROOT / "benchmarks" / "results" / "first_question.json"
# the check's first question alone (provenance.computation), in the case's tree and float order
_FIRST = """import json, sys
from pathlib import Path
from attnrepro.judge.revision import Revision
from attnrepro.provenance.computation import same_computation
r = Revision(sys.argv[1], Path("."))
c = same_computation(r.text_or_none, Path("."), r.yaml("dvc.lock"))
print(json.dumps({"answer": c.answer, "moved": c.moved}))
"""


def first_question(case: Case, rev: str, keep: bool) -> dict:
    """"Same computation?" on the case, under its float order: the corpus stage rerun where the change reaches
    it (no training), then the golden runs, fingerprint and checksums against the reference."""
    t0 = time.perf_counter()
    with CaseTree(case, rev, keep) as t:
        if "corpus" in case.stages:
            sh([sys.executable, "-m", "dvc", "repro", "--force", "--single-item", "corpus"], t.tree, t.env)
        p = sh([sys.executable, "-c", _FIRST, rev], t.tree, t.env, check=False)
    try:
        got = json.loads(p.stdout)
    except json.JSONDecodeError:
        got = {"answer": "ERROR", "moved": [p.stderr.strip()[-500:]]}
    return {"case": case.name, "area": case.area, "expect": case.expect, "declared": case.first, **got,
            "caught_by": sorted({m.split(" ", 2)[0] + " " + m.split(" ", 2)[1].rstrip(":") for m in got["moved"]}),
            "seconds": round(time.perf_counter() - t0, 1)}


def first_main(names: list[str], rev: str, keep: bool) -> int:
    results = []
    for i, name in enumerate(names):
        r = first_question(CASES[name], rev, keep)
        results.append(r)
        print(f"[{i + 1}/{len(names)}] {name:<24} declared {r['declared']:<9} answered {r['answer']:<9} "
              f"{r['seconds']:>5.1f} s  {', '.join(r['caught_by']) or '—'}", flush=True)
    wrong = [r["case"] for r in results if r["answer"] != r["declared"]]
    print(f"\n{len(results) - len(wrong)} of {len(results)} cases answered as declared"
          + (f"; not: {', '.join(wrong)}" if wrong else "") + f" (on {cpu_model()}, "
          f"{max(r['seconds'] for r in results):.0f} s the longest)")
    FIRST_RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_text(FIRST_RESULTS, json.dumps({"reference": rev, "cpu": cpu_model(), "results": results}, indent=1) + "\n")
    return 1 if wrong else 0


def run_case(case: Case, rev: str, keep: bool, decide: int = 0) -> dict:
    t0 = time.perf_counter()
    with CaseTree(case, rev, keep, store=case_store(case, rev, "decide") if decide else None) as t:
        golden = sh([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/test_golden.py"], t.tree,
                    t.env, check=False)
        cut = case.stages.index("train") + 1 if "train" in case.stages else len(case.stages)
        seconds, rerun, more = {}, [], {}
        verdict = {"verdict": "ERROR", "problems": ["no stage to rerun"]}
        for part in (case.stages[:cut], case.stages[cut:]):
            if not part:
                continue
            took, failed = t.repro(part)
            seconds.update(took)
            rerun += [s for s in part if s in took]
            if failed:
                if "train" in rerun and failed not in DECIDE_STAGES:  # what the check said before the stage failed
                    more["check_after_train"] = verdict.get("verdict")
                verdict = stage_failure(failed, t.error, mutant=case.expect != "faithful")
                break
            verdict = t.check()
            if verdict.get("verdict") != "PASS":  # caught (or broken) on what ran so far
                break
        # --decide reruns only the primary endpoints' stages: a later stage that failed does not stop it
        if decide and "train" in rerun and verdict.get("stage_failed") not in DECIDE_STAGES:
            t1 = time.perf_counter()
            more["decide"] = {**decided(case, t.check(extra=("--decide", str(decide))), t.seeds),
                              "seconds": round(time.perf_counter() - t1, 1)}
    return {**_result(case, t0, golden.returncode, verdict, seconds), "stages_rerun": rerun, **more}


def decided(case: Case, verdict: dict, seed_order: list = ()) -> dict:
    """What `check --decide` said of a case, against what the case expects (issue 42): a faithful rerun and a
    harmless mutant must never be DIFFERENT ("ok", else "wrongly DIFFERENT"); a harmful mutant is "caught" when
    an endpoint is DIFFERENT within the looks, "SAME at the margins" when every endpoint is shown within its
    margin (a finding about the margins, listed with its shifts), else "not decided" (NOT A NUMBER counts as
    DIFFERENT); "error" where no look finished or an endpoint is MISSING. Reruns that did not finish under
    the change (crashed or diverged: stage_failure's rule, as for a stage of the one-run part) are "caught"
    in a mutant, "wrongly failed" in a faithful rerun. CPU time: the last look's, which holds every run of
    the looks before it; where a look did not finish, its seeds (the first look holding the seeds that failed,
    by their place in `seed_order`, the reference's seeds) and no CPU time (None: the check recorded none)."""
    looks, ends = verdict.get("looks", []), verdict.get("endpoints", [])
    different = any(look.get(a) for look in looks for a in FAILING) or any(e["answer"] in FAILING for e in ends)
    failed = not looks and stage_failure("check --decide", "\n".join(map(str, verdict.get("problems", []))),
                                         mutant=case.expect != "faithful")["verdict"] == "FAIL"
    if failed:
        finding = "caught" if case.expect == "harmful" else "wrongly failed"
    elif not looks or any(e["answer"] == "MISSING" for e in ends):
        finding = "error"  # the reruns did not finish, or an endpoint has no value: says nothing of the case
    elif case.expect == "harmful":
        finding = "caught" if different else ("SAME at the margins" if ends and all(e["answer"] == "SAME" for e in ends)
                                              else "not decided")
    else:
        finding = "wrongly DIFFERENT" if different else "ok"
    seeds, cpu = (len(looks[-1]["seeds"]), looks[-1]["cpu_seconds"]) if looks else (0, 0.0)
    if failed:
        at = [seed_order.index(int(s)) for s in re.findall(r"seed (\d+): failed", str(verdict.get("problems")))
              if int(s) in seed_order]
        seeds, cpu = (next(n for n in LOOKS if n > max(at)) if at else 0), None
    return {"verdict": verdict.get("verdict"), "finding": finding, "looks": looks, "seeds": seeds, "cpu_seconds": cpu,
            "endpoints": [{k: e.get(k) for k in ("metric", "answer", "shift", "shift_sd", "seeds")} for e in ends],
            "problems": [] if looks else verdict.get("problems", [])}


def _cpu_min(d: dict) -> str:
    cpu = d["cpu_seconds"]
    return "CPU time not recorded (a look did not finish)" if cpu is None else f"{cpu / 60:.0f} CPU-min"


def stage_failure(stage: str, error: str, mutant: bool = True) -> dict:
    """A stage that refuses to finish because runs diverged or crashed under the change is a failed gate
    (FAIL): the sweep engine's "did not finish", or, in a mutant's case, a Python traceback (a stage script
    reports the failures that are not the code's, bad input or data, in one line, without one); any other
    failure (DVC, the data, the machine) says nothing about the gate (ERROR)."""
    caught = "did not finish" in error or "diverged" in error or (mutant and "Traceback (most recent call last)" in error)
    return {"verdict": "FAIL" if caught else "ERROR", "stage_failed": stage, "problems": [error]}


DECIDE_STAGES = ("train", "failures")  # the stages of the primary endpoints, which --decide reruns
FAILING = ("DIFFERENT", "NOT A NUMBER")  # the endpoint answers that fail the check (a diverged rerun: not a number)
EQUIVALENCE_SD = 1.0  # "within seed noise": an effect smaller than one reference seed sd


def run_seeds(case: Case, rev: str, n: int, keep: bool) -> dict:
    """The mutant's train variants at the reference's first n seeds against the reference's runs at those
    seeds. Per gated metric (every train metric but timings; on the log scale for attention statistics, as
    the check), in units of the reference's seed sd (all its seeds): the mean paired difference, its 90% t
    interval and the paired t-test's p (Holm). The verdict is one of three: "moved" (some p_holm < 0.05: a
    real effect the gate missed), "harmless" (every interval inside +/- EQUIVALENCE_SD: the effect is shown
    to be within seed noise), or "inconclusive" (neither: n seeds cannot tell; no effect found is not no
    effect). "Harmless" is an intersection-union test (Berger 1982): it claims that every metric is within
    noise, which holds at level 0.05 when each metric's two one-sided tests do (its 90% interval inside the
    margin), with no correction for the number of metrics. Besides, the tree is judged by `attnrepro check
    --rev <reference>` with this checkout's checker (its seeds paired with the reference's, seeds_test):
    what an N-seed rerun of the seeds stage meets. A mutant is also compared, the same way, with the
    faithful control at the same seeds (vs_control): made under the same float order, it differs from the
    mutant by the code alone, where the reference differs by the float order too."""
    ref = json.loads(sh(["git", "show", f"{rev}:metrics/dist/train.json"], ROOT).stdout)
    timings = yaml.safe_load(sh(["git", "show", f"{rev}:claims.yaml"], ROOT).stdout).get("timings", [])
    seeds = [int(s) for s in ref["seeds"]][:n]
    if len(seeds) < n:
        raise SystemExit(f"the reference has {len(seeds)} seeds, fewer than --seeds {n}")
    t0, store = time.perf_counter(), case_store(case, rev)
    with CaseTree(case, rev, keep, {"seeds.seeds": seeds}, store) as t:
        seconds, failed = t.repro([s for s in case.stages if s == "corpus"] + ["seeds"])
        if failed:
            return {"case": case.name, "seeds": seeds, "stage_failed": failed, "error": t.error, "store": store.name,
                    "seconds": round(time.perf_counter() - t0, 1)}
        ours = json.loads((t.tree / "metrics/dist/train.json").read_text())
        verdict = t.check(ROOT / "src")
    mine, theirs = per_seed(ours, seeds), per_seed(ref, seeds)
    keys = [k for k in sorted(set.intersection(*(set(m) for m in (*mine.values(), *theirs.values()))))
            if not any(fnmatch.fnmatchcase(f"train.{k}", g) for g in timings) and k in ref["stats"]]
    return {"case": case.name, "seeds": seeds, **seed_effects(mine, theirs, ref["stats"], keys),
            "vs_control": against_control(case, rev, mine, ref["stats"], keys),
            "check": {"verdict": verdict.get("verdict"), "caught_by": caught_by(verdict, False),
                      "failed_metrics": [m["key"] for m in verdict.get("failed_metrics", [])],
                      "problems": verdict.get("problems", [])},
            "seconds": round(time.perf_counter() - t0, 1), "stage_seconds": seconds, "store": store.name}


CONTROL = "avx2"  # the faithful rerun made as every mutant is (AVX2, 2 workers): the same float order


def against_control(case: Case, rev: str, mine: dict, ref_stats: dict, keys: list[str]) -> dict:
    """seed_effects of the mutant's runs `mine` against the faithful control's at the same seeds, on the
    metrics both have: {} where the case has no control, an "error" where the control's runs failed
    (the mutant's own comparison stands)."""
    t0 = time.perf_counter()
    try:
        control = control_runs(case, rev, list(mine))
    except RuntimeError as e:
        return {"control": CONTROL, "error": str(e)[-500:], "seconds": round(time.perf_counter() - t0, 1)}
    if not control:
        return {}
    keys = [k for k in keys if all(k in runs for runs in control.values())]
    e = seed_effects(mine, control, ref_stats, keys)
    return {"control": CONTROL, **{k: e[k] for k in ("verdict", "moved", "not_within_noise", "max_abs_effect_sd",
                                                       "widest_bound_sd")},
            "metrics": len(keys), "seconds": round(time.perf_counter() - t0, 1)}


def control_runs(case: Case, rev: str, seeds: list[int]) -> dict:
    """The faithful control's runs at `seeds` ({seed: {metric: value}}) for a mutant made under the control's
    float order and worker count, or {} (a faithful case, or another float order). Against the reference
    a mutant's effect carries the float order's too (AVX2 alone moves d32_scaled ||W_qkv|| l1 by -0.26 seed
    sd on every one of 5 seeds); against the control only the code differs. Served from the control's
    store where it ran at these seeds (seconds), trained otherwise (as long as the case itself)."""
    c = CASES[CONTROL]
    if case.expect == "faithful" or (case.isa, case.workers) != (c.isa, c.workers):
        return {}
    with CaseTree(c, rev, False, {"seeds.seeds": seeds}, case_store(c, rev)) as t:
        _, failed = t.repro(["seeds"])
        if failed:
            raise RuntimeError(f"the faithful control {CONTROL} failed at seeds {seeds}: {t.error}")
        return per_seed(json.loads((t.tree / "metrics/dist/train.json").read_text()), seeds)


def per_seed(dist: dict, seeds: list[int]) -> dict:
    """A seed distribution file's runs at `seeds`: {seed: {metric: value}}."""
    from attnrepro.stats import flatten

    return {s: flatten(dist["runs"][str(s)]) for s in seeds}


def case_store(case: Case, rev: str, form: str = "seeds") -> Path:
    """The run store of `case`'s --seeds (or --decide) runs against `rev`: its own, as a mutant keeps the
    reference's run keys, and named by the full revision and every field of the case, so a changed case
    starts afresh."""
    full = sh(["git", "rev-parse", f"{rev}^{{commit}}"], ROOT).stdout.strip()
    digest = hashlib.sha256(repr(dataclasses.astuple(case)).encode()).hexdigest()[:12]
    return CASE_STORES / (f"{full[:12]}-{case.name}-{digest}" + ("" if form == "seeds" else f"-{form}"))


def seed_effects(mine: dict, theirs: dict, ref_stats: dict, keys: list[str]) -> dict:
    """run_seeds' statistics: mine/theirs {seed: {metric: value}} (the same seeds), ref_stats the reference's
    seed summary per metric (its sd, and log_sd for a log-scale metric)."""
    from attnrepro.experiments.sensitivity import paired_effect
    from attnrepro.stats import holm_adjusted, log_scale

    seeds = list(mine)
    alpha = 2 * 0.05  # 90% intervals: each metric's two one-sided tests at 0.05 (the intersection-union test)
    rows = []
    for key in keys:
        s_ref = ref_stats[key]
        log = log_scale(key) and "log_sd" in s_ref and all(x[key] > 0 for x in (*mine.values(), *theirs.values()))
        sd = s_ref["log_sd"] if log else s_ref["sd"]
        e = paired_effect([mine[s][key] for s in seeds], [theirs[s][key] for s in seeds], log, alpha)
        mean, p, lo, hi = e["diff"], e["p"], e["ci_lo"], e["ci_hi"]
        unit = sd if sd > 0 else float("nan")
        rows.append({"metric": key, "log": int(log), "mean_diff": mean, "seed_sd": sd, "p": p,
                     "effect_sd": mean / unit, "ci_sd": [lo / unit, hi / unit],
                     "diff_sd": e["se"] * math.sqrt(len(seeds)) / unit,
                     # a metric the same on every reference seed (a count) is within noise only unchanged
                     "within_noise": int(all(mine[s][key] == theirs[s][key] for s in seeds) if sd == 0
                                         else -EQUIVALENCE_SD * sd < lo and hi < EQUIVALENCE_SD * sd)})
    for r, adjusted in zip(rows, holm_adjusted([r["p"] for r in rows])):
        r["p_holm"] = adjusted
    moved = [r for r in rows if r["p_holm"] < 0.05]
    verdict = "moved" if moved else ("harmless" if rows and all(r["within_noise"] for r in rows) else "inconclusive")
    widest = max((max(abs(x) for x in r["ci_sd"]) for r in rows if math.isfinite(r["ci_sd"][0])), default=0.0)
    needed = sorted((seeds_to_show_within_noise(r["diff_sd"]), r["metric"]) for r in rows if math.isfinite(r["diff_sd"]))
    return {"metrics": len(rows), "moved": moved, "verdict": verdict,
            "seeds_needed": {"metrics": len(needed), "median": needed[len(needed) // 2][0], "max": needed[-1][0],
                             "max_metric": needed[-1][1],
                             "metrics_over": {str(k): sum(n > k for n, _ in needed) for k in (5, 10, 20)}}
            if needed else {},
            "not_within_noise": [r["metric"] for r in rows if not r["within_noise"]],
            "max_abs_effect_sd": max((abs(r["effect_sd"]) for r in rows if math.isfinite(r["effect_sd"])), default=0.0),
            "widest_bound_sd": widest}


def seeds_to_show_within_noise(diff_sd: float, margin: float = EQUIVALENCE_SD) -> int:
    """The seeds a case with no effect at all needs for one metric's 90% interval to lie inside +/- margin
    (seed sd) half the time, the sd of its paired differences being diff_sd (seed sd): the smallest n (at
    most 100000) with sqrt(n) margin / diff_sd - t(0.95, n - 1) >= z(0.75), taking the sample sd as the
    true one (accurate to about one seed then). diff_sd measured on 5 seeds is itself rough (the true sd
    lies within about 0.65-2.4 times it, 90% of the time), and the largest of many such estimates is biased
    upward: figures of order, not of precision. Every metric at once needs at least the hardest one's."""
    from scipy.stats import norm

    from attnrepro.stats import t_quantile

    n = 2
    while n < 100_000 and math.sqrt(n) * margin - t_quantile(0.95, n - 1) * diff_sd < norm.ppf(0.75) * diff_sd:
        n += 1
    return n


def _result(case: Case, t0: float, golden_rc: int, verdict: dict, stage_seconds: dict) -> dict:
    return {"case": case.name, "area": case.area, "expect": case.expect, "why": case.why,
            "declared_second": case.second[0], "golden_test": "FAIL" if golden_rc != 0 else "PASS", "verdict": verdict.get("verdict"),
            "caught_by": caught_by(verdict, golden_rc != 0), "failed_metrics": [m["key"] for m in
                                                                             verdict.get("failed_metrics", [])],
            "problems": verdict.get("problems", []), "stage_failed": verdict.get("stage_failed"),
            "stage_seconds": stage_seconds, "seconds": round(time.perf_counter() - t0, 1),
            "cpu": cpu_model()}  # the matrix spans sessions, and their machines differ (Intel, AMD)


def caught_by(verdict: dict, golden_failed: bool) -> list[str]:
    """Every kind of check that failed the case, cheapest first."""
    kinds = ["golden test"] if golden_failed else []
    if verdict.get("stage_failed"):
        kinds.append(f"stage {verdict['stage_failed']} failed")
    problems = " ".join(str(p) for p in verdict.get("problems", []))
    if "dvc.lock" in problems or "metrics/env" in problems:
        kinds.append("records")
    claims = verdict.get("claims", {})
    if claims.get("checksum", {}).get("failed"):
        kinds.append("checksum")
    # conclusions the reference does not reproduce either fail on every run: not a catch
    if claims.get("conclusion", {}).get("failed", 0) > len(verdict.get("not_reproduced", [])) \
            or "holds on this run, but not on the reference's run" in problems:  # a finding that moved
        kinds.append("conclusion")
    if any(e.get("answer") in FAILING for e in verdict.get("endpoints", [])):
        kinds.append("primary endpoint")
    keys = [m["key"] for m in verdict.get("failed_metrics", [])]
    if keys and all(_init_statistic(k) for k in keys):  # issue 42: those belong to the golden tests
        return kinds + ["failed metrics: init statistics only"]
    if any(k.startswith(("train.", "seeds.")) for k in keys):
        kinds.append("train metric")
    if any(not k.startswith(("train.", "seeds.")) for k in keys):
        kinds.append("other metric")
    return kinds


def _init_statistic(key: str) -> bool:
    """A statistic of the untrained model: the init sweep's, or a stage's init_* diagnostics."""
    return key.startswith("init_sweep.") or ".init_" in key


# ---------------------------------------------------------------- the tables

def confusion(results: list[dict], seed_results: dict | None = None) -> str:
    """Expected x verdict; ERROR (the case could not be judged: a crash that is not the change's) is its own
    column, never counted as caught. The last column: of the cases that also ran at more seeds
    (`seed_results`, the results file's --seeds comparisons), how many the check failed there."""
    seed_results = seed_results or {}
    rows = ("harmful", "harmless", "faithful")
    lines = ["expected    gate FAIL  gate PASS  ERROR   golden test FAIL   --seeds: FAIL of run", "-" * 80]
    for e in rows:
        rs = [r for r in results if r["expect"] == e]
        if rs:
            n = {v: sum(r["verdict"] == v for r in rs) for v in ("FAIL", "PASS")}
            verdicts = [seed_results[r["case"]].get("check", {}).get("verdict") for r in rs
                        if r.get("case") in seed_results]
            seeds_failed = f"{verdicts.count('FAIL')} of {len(verdicts)}"
            lines.append(f"{e:<10}  {n['FAIL']:>9}  {n['PASS']:>9}  {len(rs) - n['FAIL'] - n['PASS']:>5}   "
                         f"{sum(r['golden_test'] == 'FAIL' for r in rs):>16}   {seeds_failed:>19}")
    cost = sum(r["seconds"] for r in results)
    cpus = sorted({r.get("cpu", "a machine not recorded") for r in results})
    lines.append(f"cost: {cost / 3600:.1f} h of wall time ({len(results)} cases, on {', '.join(cpus)})")
    return "\n".join(lines)


def table(results: list[dict], seed_results: dict | None = None) -> str:
    """One line per case; `seed_results` (the results file's --seeds comparisons) adds, after its number of
    seeds, the check's verdict on the case's rerun at those seeds and the paired effects' verdict against the
    reference (and / against the faithful control, made under the same float order), where one ran."""
    seed_results = seed_results or {}
    lines = [f"{'case':<22} {'area':<12} {'expect':<9} {'gate':<5} {'golden':<6} {'min':>5}  {'seeds: gate, effect / vs control':<38}"
             " caught by (cheapest first)"]
    for r in results:
        s = seed_results.get(r["case"], {})
        more = (f"{len(s.get('seeds', []))}: {s.get('check', {}).get('verdict', '?')}, {s['verdict']}"
                if "verdict" in s else "—")
        if s.get("vs_control"):
            more += f" / {s['vs_control'].get('verdict', 'error')}"
        if r.get("check_after_train"):
            more += f"; after train: {r['check_after_train']}"
        if r.get("decide"):
            more += f"; --decide {r['decide']['seeds']}: {r['decide']['finding']}"
        lines.append(f"{r['case']:<22} {r['area']:<12} {r['expect']:<9} {r['verdict']:<5} {r['golden_test']:<6} "
                     f"{r['seconds'] / 60:>5.1f}  {more:<38} {', '.join(r['caught_by']) or '—'}")
    return "\n".join(lines)


def load_results(rev: str) -> dict:
    """The results file so far, or an empty one where it was judged against another reference (the
    matrix is of one reference); the other reference's file is kept beside it, renamed."""
    previous = json.loads(RESULTS.read_text()) if RESULTS.exists() else {"results": []}
    if previous.get("reference", rev) != rev:
        old = RESULTS.with_name(f"{RESULTS.stem}.{previous['reference'][:10]}.json")
        RESULTS.rename(old)
        print(f"{RESULTS}: its results are against {previous['reference'][:10]}, not {rev[:10]}: kept as {old.name}, "
              "starting afresh", flush=True)
        return {"results": []}
    return previous


def save(rev: str, update) -> None:
    """Read, `update` and rewrite the results file under a lock, so that two runs of this script at
    once (a serial case beside the others, say) each add their cases without dropping the other's."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with open(Path(tempfile.gettempdir()) / f"{RESULTS.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = load_results(rev)
        update(data)
        write_text(RESULTS, json.dumps({"reference": rev, **data}, indent=1) + "\n")


def _put(results: list[dict], r: dict) -> None:
    """Replace the case's earlier result in place, or append it."""
    at = [i for i, x in enumerate(results) if x["case"] == r["case"]]
    if at:
        results[at[0]] = r
    else:
        results.append(r)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all; --list shows them)")
    ap.add_argument("--rev", default="HEAD", help="the reference revision the cases start from and are judged against")
    ap.add_argument("--keep", action="store_true", help="keep each case's worktree (printed) for inspection")
    ap.add_argument("--resume", action="store_true",
                    help="skip the cases the results file already judged against this reference (an ERROR is "
                         "rerun; a case whose definition changed since must be named in --cases without --resume)")
    ap.add_argument("--list", action="store_true", help="list the cases and exit")
    ap.add_argument("--stages", default="", help="comma-separated stages to rerun instead of each case's own "
                                                 "(a quick trial of the harness)")
    ap.add_argument("--data", type=Path, default=ROOT / "data",
                    help="the data folder each case starts from (default: this checkout's)")
    ap.add_argument("--decide", type=int, nargs="?", const=10, default=0, metavar="MAX_SEEDS",
                    help="after each case's one-run verdict, `attnrepro check --decide MAX_SEEDS` on it (the primary "
                         "endpoints rerun at the reference's first 1, 3, 5, 10 seeds until decided; default 10): its "
                         "looks, answers and CPU time go in the results under `decide`")
    ap.add_argument("--first", action="store_true",
                    help="only the check's first question, same computation? (golden runs, fingerprint, checksums: "
                         "seconds a case, no training), against each case's declared answer: "
                         "benchmarks/results/first_question.json")
    ap.add_argument("--seeds", type=int, default=0, metavar="N",
                    help="instead of the check: each case's train variants at the reference's first N seeds, "
                         "paired with the reference's runs (is a mutant the gate passed harmless?)")
    args = ap.parse_args(argv)
    if args.list:
        for c in CASES.values():
            print(f"{c.name:<22} {c.expect:<9} {c.area:<12} {c.why}")
        return 0
    global DATA_DIR
    DATA_DIR = args.data
    if args.stages:  # a trial of the harness: its verdicts go to a file of their own, never into the matrix
        global RESULTS
        RESULTS = RESULTS.with_name(f"{RESULTS.stem}.trial.json")
        for name, c in CASES.items():
            CASES[name] = dataclasses.replace(c, stages=tuple(args.stages.split(",")))
    names = [n for n in args.cases.split(",") if n] or list(CASES)
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown case {unknown[0]!r} (--list shows them)")
    rev = sh(["git", "rev-parse", "--verify", f"{args.rev}^{{commit}}"], ROOT).stdout.strip()
    for c in (CASES[n] for n in names):  # fail before hours of work, not after, on the code the cases start from
        if c.path and sh(["git", "show", f"{rev}:{c.path}"], ROOT).stdout.count(c.old) != 1:
            raise SystemExit(f"mutant {c.name}: its text is not in {c.path} at {rev[:10]} exactly once")
    if args.first:
        return first_main(names, rev, args.keep)
    if args.seeds:
        return seeds_main(names, rev, args.seeds, args.keep)
    previous = load_results(rev)
    results = {r["case"]: r for r in previous["results"]}
    if args.resume:
        done = [n for n in names if n in results and results[n].get("verdict") != "ERROR"]
        if done:
            print(f"--resume: {len(done)} case(s) already judged against {rev[:10]}: {', '.join(done)}", flush=True)
        names = [n for n in names if n not in done]
    for i, name in enumerate(names):
        print(f"[{i + 1}/{len(names)}] {name}: {CASES[name].why}", flush=True)
        r = run_case(CASES[name], rev, args.keep, args.decide)
        print(f"  gate {r['verdict']}, golden test {r['golden_test']}, {r['seconds'] / 60:.1f} min; caught by: "
              f"{', '.join(r['caught_by']) or 'nothing'}"
              + (f"; --decide: {r['decide']['finding']} at {r['decide']['seeds']} seeds, {_cpu_min(r['decide'])}"
                 if "decide" in r else ""), flush=True)
        save(rev, lambda d, r=r: _put(d["results"], r))
    everything = load_results(rev)  # with any other run's cases
    results = {r["case"]: r for r in everything["results"]}
    done = [results[n] for n in CASES if n in results]
    print("\n" + table(done, everything.get("seeds")) + "\n\n" + confusion(done, everything.get("seeds")))
    return 0


def put_seeds(seeds: dict, name: str, r: dict) -> None:
    """Store a --seeds result; a resumed comparison (the same run store) adds its wall time to the
    earlier ones' (`seconds_total`), so the cost of the runs it was served stays on record. A comparison at
    other seeds (--seeds 10 after --seeds 5) keeps the earlier ones in `earlier`: their verdicts stay data."""
    old = dict(seeds.get(name, {}))
    same = old.get("store") in (None, r.get("store"))  # a result from before stores were named: the same
    before = old.get("seconds_total", old.get("seconds", 0.0)) if same else 0.0
    r["seconds_total"] = round(before + r.get("seconds", 0.0), 1)
    earlier = old.pop("earlier", []) if same else []  # another case definition's verdicts are not this one's
    if old and same and old.get("seeds") != r.get("seeds"):
        earlier.append(old)
    if earlier:
        r["earlier"] = earlier
    seeds[name] = r


def effects_line(e: dict) -> str:
    """One comparison's summary (seed_effects' verdict and figures), against the reference or the control."""
    return (f"{e['verdict']}: {e['metrics']} metrics, {len(e['moved'])} moved (Holm, alpha 0.05), "
            f"{e['metrics'] - len(e['not_within_noise'])} shown within ±{EQUIVALENCE_SD:g} seed sd (90% intervals, "
            f"the widest reaching {e['widest_bound_sd']:.2f} sd); largest |effect| {e['max_abs_effect_sd']:.2f} seed sd")


def print_moved(rows: list[dict]) -> None:
    for m in rows[:10]:
        print(f"    {m['metric']}: {m['mean_diff']:+.4g} ({m['effect_sd']:+.2f} sd, Holm p {m['p_holm']:.3g})")


def seeds_main(names: list[str], rev: str, n: int, keep: bool) -> int:
    for name in names:
        print(f"{name}: the train variants at {n} seeds ({CASES[name].why})", flush=True)
        r = run_seeds(CASES[name], rev, n, keep)
        if "moved" in r:
            print(f"  {effects_line(r)}; {r['seconds'] / 60:.1f} min", flush=True)
            if r.get("seeds_needed"):
                need = r["seeds_needed"]
                print(f"  to show a case with no effect within ±{EQUIVALENCE_SD:g} sd half the time, one metric needs "
                      f"{need['median']} seeds (median), the hardest ({need['max_metric']}) {need['max']}; metrics "
                      f"needing more than 5, 10, 20 seeds: {', '.join(map(str, need['metrics_over'].values()))}", flush=True)
            print_moved(r["moved"])
            vc = r.get("vs_control") or {}
            if vc.get("error"):
                print(f"  against the faithful {vc['control']} rerun: not compared ({vc['error']})", flush=True)
            elif vc:
                print(f"  against the faithful {vc['control']} rerun at the same seeds (only the code differs): "
                      f"{effects_line(vc)}", flush=True)
                print_moved(vc["moved"])
            c = r["check"]
            print(f"  attnrepro check on the {n}-seed rerun: {c['verdict']}; caught by: "
                  f"{', '.join(c['caught_by']) or 'nothing'}; failed metrics: {', '.join(c['failed_metrics']) or '—'}")
            for problem in c["problems"][:10]:
                print(f"    {problem}")
        else:
            print(f"  stage {r['stage_failed']} failed: {r['error']}")
        save(rev, lambda d, name=name, r=r: put_seeds(d.setdefault("seeds", {}), name, r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
