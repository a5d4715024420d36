"""Strict params loading: the real params.yaml loads; bad values stop a stage with exit 2,
one line on stderr naming the key and what was expected, and no outputs."""

import ast
import copy
import dataclasses
import typing

import pytest
import yaml

from attnrepro import config, files
from attnrepro.config import ConfigError, from_dict
from attnrepro.data.corpus import CorpusConfig
from attnrepro.model.transformer import ModelConfig
from attnrepro.run.loop import OptimConfig

from attnrepro.experiments.comparison import SeedsConfig
from attnrepro.experiments.protocol import model_config

from conftest import CHAPTER_OPTIM, REPO, call_stage, load_stage_module, output_files, run_script, tinygpt

PARAMS = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))


def test_real_params_corpus_section():
    cfg = from_dict(CorpusConfig, PARAMS["corpus"], "corpus")
    assert cfg.source in ("npm", "url", "local")
    assert len(cfg.files) == 4 and cfg.vocab_size == 1200


def test_real_params_train_section():
    train = load_stage_module("train")
    cfg = from_dict(train.TrainConfig, PARAMS["train"], "train")
    assert set(cfg.variants) == {"d32_unscaled", "d32_scaled", "d256_unscaled", "d256_scaled"}
    assert isinstance(cfg.lr, float) and cfg.betas == [0.9, 0.95]
    for name in cfg.variants:
        assert model_config(cfg.models, cfg.variants[name], f"train.variants.{name}").d_head in (32, 256)
    from attnrepro.run.execute import DiagSchedule

    spec = cfg.spec("d32_scaled", cfg.seed, "cpu")
    sched = DiagSchedule(spec.diag_every, frozenset(spec.diag_steps), spec.steps)
    assert all(s in sched for s in cfg.diag_steps if s < cfg.steps) and 10 in sched and cfg.steps not in sched
    assert [s for s in range(cfg.steps + 5) if s in sched] == \
        sorted(set(range(0, cfg.steps, cfg.diag_every)) | {s for s in cfg.diag_steps if s < cfg.steps})


def test_a_huge_step_count_is_refused_and_the_schedule_stays_a_rule(tmp_path):
    """train.steps 1e9 once ate 6 GB before any output: a diagnostics schedule materialised into the spec."""
    from attnrepro.config import ConfigError
    from attnrepro.run.spec import RunSpec

    train = load_stage_module("train")
    data = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))["train"]
    with pytest.raises(ConfigError, match=r"train.steps: got 1000000000, expected at most 10,000,000 steps"):
        from_dict(train.TrainConfig, {**data, "steps": 10**9}, prefix="train")
    cfg = from_dict(train.TrainConfig, {**data, "steps": 10**7}, prefix="train")
    spec = cfg.spec("d32_scaled", 0, "cpu")
    assert isinstance(spec, RunSpec) and len(spec.diag_steps) <= len(cfg.diag_steps)


@pytest.mark.parametrize("seed,ok", [(0, True), (2**63 - 1, True), (2**63, False), (-1, False)])
def test_seeds_are_bounded(seed, ok):
    from attnrepro.config import ConfigError

    train = load_stage_module("train")
    data = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    if ok:
        from_dict(train.TrainConfig, {**data["train"], "seed": seed}, prefix="train")
        return
    with pytest.raises(ConfigError, match=r"train.seed: .*no negative seeds"):
        from_dict(train.TrainConfig, {**data["train"], "seed": seed}, prefix="train")
    with pytest.raises(ConfigError, match=r"seeds.seeds\[1\]: .*no negative seeds"):
        from_dict(SeedsConfig, {**data["seeds"], "seeds": [1, seed, 3]}, prefix="seeds")


def _registered_sections():
    """(stage script, section, class expression) for every dvc.yaml stage's Stage.section calls
    (`st.section(Cls, "name")`, attnrepro.run.stage)."""
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text(encoding="utf-8")).get("stages", {})
    scripts = sorted({(REPO / "stages" / f"{n}.py") for n in stages} & set((REPO / "stages").glob("*.py")))
    found = []
    for path in scripts:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "section"
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
                found.append((path.stem, node.args[1].value, ast.unparse(node.args[0])))
    return found


@pytest.mark.parametrize("stage,section,cls_expr", _registered_sections(), ids=lambda x: str(x))
def test_real_params_every_registered_stage(stage, section, cls_expr):
    """Every stage registered in dvc.yaml loads its section of the real params.yaml."""
    mod = load_stage_module(stage)
    cls = eval(cls_expr, vars(mod))  # e.g. "corpus.CorpusConfig" or "TrainConfig"
    from_dict(cls, PARAMS[section], section)


def test_registered_sections_include_the_spine():
    assert {("corpus", "corpus"), ("train", "train")} <= {(a, b) for a, b, _ in _registered_sections()}


# --- in-process validation -------------------------------------------------------------

def test_unknown_key_rejected():
    with pytest.raises(ConfigError, match=r"^corpus\.vocab_sise: unknown key"):
        from_dict(CorpusConfig, {**PARAMS["corpus"], "vocab_sise": 3}, "corpus")


@pytest.mark.parametrize("key,value,expected", [
    ("steps", "many", "an integer"),
    ("steps", True, "an integer"),
    ("lr", "fast", "a number"),
    ("betas", 0.9, "a list"),
    ("steps", 0, "a positive integer"),
    ("steps", -5, "a positive integer"),
    ("lr", 0, "a finite positive number"),
    ("lr", float("inf"), "a finite positive number"),
    ("grad_clip", float("nan"), "a finite positive number, or null"),
    ("optimizer", "sgd", "'adamw'"),
])
def test_optim_bad_values(key, value, expected):
    with pytest.raises(ConfigError) as e:
        from_dict(OptimConfig, {**CHAPTER_OPTIM, key: value}, "train")
    msg = str(e.value)
    assert msg.startswith(f"train.{key}: ") and expected in msg and "\n" not in msg


def test_float_accepts_yaml_exponent_string():
    assert from_dict(OptimConfig, {**CHAPTER_OPTIM, "lr": "3e-3"}, "train").lr == 0.003


def test_literal_rejects_other_values():
    with pytest.raises(ConfigError, match="corpus.source.*'npm'"):
        from_dict(CorpusConfig, {**PARAMS["corpus"], "source": "ftp"}, "corpus")


def test_model_d_model_not_divisible():
    with pytest.raises(ConfigError, match=r"m\.d_model: got 130, expected a multiple of n_head \(4\)"):
        from_dict(ModelConfig, {**dataclasses.asdict(tinygpt()), "d_model": 130, "n_head": 4}, "m")


def test_a_model_names_every_field():
    fields = dataclasses.asdict(tinygpt())
    fields.pop("init")
    with pytest.raises(ConfigError, match=r"^m\.init: missing"):
        from_dict(ModelConfig, fields, "m")


def test_missing_params_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        files.read_params(tmp_path / "nope.yaml")


def test_broken_yaml_names_the_line(tmp_path):
    """params and the claims file share one reader: a one-line error with the line number."""
    from attnrepro.judge.claims import ClaimError, load as load_claims

    bad = tmp_path / "bad.yaml"
    bad.write_text("a: 1\nb:\n  reason: two: colons\n", encoding="utf-8")
    for load, err in ((files.read_params, ConfigError), (load_claims, ClaimError)):
        with pytest.raises(err, match=r"bad\.yaml: not valid YAML at line 3 \(ScannerError\)$"):
            load(bad)
    bad.write_text("- a list\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="expected a mapping at the top level"):
        files.read_params(bad)


# --- stage scripts: exit 2, one line, nothing written ---------------------------------

def _write_params(root, mutate):
    p = copy.deepcopy(PARAMS)
    mutate(p)
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(p, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def _set(path_keys, value):
    def mutate(p):
        d = p
        for k in path_keys[:-1]:
            d = d[k]
        d[path_keys[-1]] = value
    return mutate


def _assert_one_line_error(proc, *needles):
    """proc: a CompletedProcess or call_stage's (code, stdout, stderr)."""
    code, stderr = (proc.returncode, proc.stderr) if hasattr(proc, "returncode") else (proc[0], proc[2])
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    for n in needles:
        assert n in lines[0], lines[0]


TRAIN_CASES = [
    ("unknown key", _set(["train", "stepz"], 3), ["train.stepz", "unknown key"]),
    ("wrong type", _set(["train", "batch_size"], "32x"), ["train.batch_size", "an integer"]),
    ("d_model % n_head", _set(["train", "models", "small", "d_model"], 130),
     ["train.variants.d32_unscaled.d_model", "multiple of n_head"]),
    ("steps <= 0", _set(["train", "steps"], 0), ["train.steps", "a positive integer"]),
    ("infinite lr", _set(["train", "lr"], float("inf")), ["train.lr", "finite"]),
    ("empty prompt", _set(["train", "sample_prompt"], ""), ["train.sample_prompt", "non-empty"]),
    ("negative temperature", _set(["train", "sample_temperature"], -1), ["train.sample_temperature", ">= 0"]),
    ("unknown preset", _set(["train", "variants", "d32_scaled", "model"], "medium"),
     ["train.variants.d32_scaled.model", "one of large, small"]),
    ("unknown switch", _set(["train", "variants", "d32_scaled", "scaledd"], True),
     ["train.variants.d32_scaled.scaledd", "unknown key"]),
    ("bad device", _set(["train", "device"], "tpu"), ["train.device", "'cpu'"]),
]


@pytest.mark.parametrize("case,mutate,needles", TRAIN_CASES, ids=[c[0] for c in TRAIN_CASES])
def test_train_stage_rejects(repo_copy, case, mutate, needles):
    _write_params(repo_copy, mutate)
    _assert_one_line_error(call_stage("train", cwd=repo_copy), *needles)
    assert output_files(repo_copy) == []


def test_train_stage_bad_params_subprocess(repo_copy):
    """The real command line, as DVC runs it (the other cases run the same main in-process)."""
    _write_params(repo_copy, _set(["train", "stepz"], 3))
    proc = run_script("stages/train.py", cwd=repo_copy)
    _assert_one_line_error(proc, "train.stepz", "unknown key")
    assert output_files(repo_copy) == []


def test_train_stage_with_params_flag(tmp_path, repo_copy):
    params = _write_params(tmp_path, _set(["train", "threads"], 0))
    proc = call_stage("train", "--params", params, cwd=repo_copy)
    _assert_one_line_error(proc, "train.threads", "a positive integer")
    assert output_files(repo_copy) == []


CORPUS_CASES = [
    ("unknown key", _set(["corpus", "vocab"], 3), ["corpus.vocab", "unknown key"]),
    ("wrong type", _set(["corpus", "vocab_size"], "1200"), ["corpus.vocab_size", "an integer"]),
    ("vocab too small", _set(["corpus", "vocab_size"], 2), ["corpus.vocab_size", "> 2"]),
    ("val_fraction", _set(["corpus", "val_fraction"], 1.5), ["corpus.val_fraction", "(0, 1)"]),
    ("bad hash", _set(["corpus", "files", "poet.tang.0.json"], "abc"),
     ["corpus.files.poet.tang.0.json", "SHA-256"]),
    ("bad integrity", _set(["corpus", "npm_integrity"], "md5-xyz"), ["corpus.npm_integrity", "sha512-"]),
]


@pytest.mark.parametrize("case,mutate,needles", CORPUS_CASES, ids=[c[0] for c in CORPUS_CASES])
def test_corpus_stage_rejects(tmp_path, repo_copy, case, mutate, needles):
    params = _write_params(tmp_path, mutate)
    _assert_one_line_error(call_stage("corpus", "--params", params, cwd=repo_copy), *needles)
    assert output_files(repo_copy) == []


def test_train_without_corpus(repo_copy):
    proc = call_stage("train", cwd=repo_copy)
    _assert_one_line_error(proc, "data/corpus", "dvc repro corpus")
    assert output_files(repo_copy) == []


# --- one source of defaults: params.yaml ----------------------------------------------------

def _section_classes():
    """(stage, section, config class) of every registered stage, loaded from the stage module."""
    return [(stage, section, eval(expr, vars(load_stage_module(stage)))) for stage, section, expr in
            _registered_sections()]


def _missing_cases():
    cases = []
    for stage, section, cls in _section_classes():
        for key in PARAMS[section]:
            cases.append((section, cls, key))
    return cases


@pytest.mark.parametrize("section,cls,key", _missing_cases(), ids=lambda x: getattr(x, "__name__", str(x)))
def test_deleting_a_params_line_is_an_error_naming_the_key(section, cls, key):
    """No config class has a default that could silently stand in for a deleted params line
    (issue 13: classes defaulted threads to 2 while params.yaml said 1)."""
    data = copy.deepcopy(PARAMS[section])
    del data[key]
    with pytest.raises(ConfigError, match=rf"^{section}\.{key}: missing"):
        from_dict(cls, data, prefix=section)


def test_config_classes_have_no_defaults():
    import dataclasses

    seen = set()
    todo = [cls for _, _, cls in _section_classes()]
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for f in dataclasses.fields(cls):
            assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, \
                f"{cls.__name__}.{f.name} has a default: params.yaml must be the only source"
        hints = typing.get_type_hints(cls)
        todo += [t for h in hints.values() for t in (h, *typing.get_args(h)) if dataclasses.is_dataclass(t)]
    assert len(seen) >= 10


def test_config_classes_live_in_the_library():
    """Stage scripts import their config classes from attnrepro; none is defined in stages/."""
    for _, _, cls in _section_classes():
        assert cls.__module__.startswith("attnrepro."), f"{cls.__name__} is defined in {cls.__module__}"
    for path in sorted((REPO / "stages").glob("*.py")):  # the sweep stages' configs too
        classes = [n.name for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.ClassDef)]
        assert not classes, f"{path.name} defines {classes}"
