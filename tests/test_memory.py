"""memory: eq. 1.20 (KV cache) and eq. 1.45 (attention matrices) and the CLI.

The published figures are checked against the formula evaluated on the published
inputs: these tests pin the arithmetic of the definitions, not a measurement.
"""

import json
import subprocess
import sys

import pytest

from attnrepro.commands import kv_calculator as kv_cli
from attnrepro.config import ConfigError, UserError
from attnrepro.model import kv_accounting as mem


def test_llama2_70b_mha_per_token_and_4096():
    s = mem.PRESETS["llama2-70b-mha"]
    assert s.kv_bytes_per_token() == 2_621_440 == 2 * 80 * 64 * 128 * 2
    assert round(s.kv_bytes(4096) / 1e9, 1) == 10.7
    assert s.kind == "MHA"


def test_gqa_and_mqa():
    gqa, mqa = mem.PRESETS["llama2-70b-gqa"], mem.PRESETS["llama2-70b-mqa"]
    assert round(gqa.kv_bytes_per_token() / 1e6, 2) == 0.33
    assert round(gqa.kv_bytes(4096) / 1e9, 1) == 1.3
    assert round(mqa.kv_bytes_per_token() / 1e6, 2) == 0.04
    assert (gqa.kind, mqa.kind) == ("GQA", "MQA")
    assert mem.PRESETS["llama2-70b-mha"].kv_bytes_per_token() == 8 * gqa.kv_bytes_per_token()


def test_attention_matrix_figures():
    assert round(mem.attention_matrix_bytes(4096, 32, 32, 2) / 1e9) == 34
    assert round(mem.attention_matrix_bytes(2048, 16, 24, 2) / 1e9, 2) == 3.22
    assert round(mem.attention_matrix_bytes(8192, 1, 1, 2) / 1e6) == 134
    assert mem.attention_matrix_bytes(8, 1, 1, 4, batch=3) == 8 * 8 * 4 * 3


def test_tinygpt_presets():
    assert mem.PRESETS["tinygpt-small"].kv_bytes_per_token() == 2 * 2 * 4 * 32 * 4
    assert mem.PRESETS["tinygpt-large"].kv_bytes(64) == 2 * 2 * 1 * 256 * 64 * 4
    assert mem.kv_cache_bytes(2, 4, 32, 64, 4, batch=2) == 2 * mem.kv_cache_bytes(2, 4, 32, 64, 4)


def test_shape_validation():
    with pytest.raises(ConfigError, match="n_kv_head"):
        mem.Shape(2, 6, 4, 32, "fp16").validate()
    with pytest.raises(ConfigError, match="dtype"):
        mem.Shape(2, 4, 4, 32, "fp12").validate()
    with pytest.raises(ConfigError, match="preset"):
        mem.preset("gpt-5")


def test_cli_preset_json(capsys):
    assert kv_cli.main(["--preset", "llama2-70b-mha", "--seq", "4096", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_token"] == 2_621_440 and out["kv_bytes"] == 2_621_440 * 4096


def test_cli_override_and_missing(capsys):
    kv_cli.main(["--preset", "llama2-70b-mha", "--kv-heads", "1", "--json"])
    assert json.loads(capsys.readouterr().out)["kv_bytes_per_token"] == 40_960
    with pytest.raises(ConfigError, match="--d-head"):
        kv_cli.main(["--layers", "80", "--kv-heads", "8"])
    with pytest.raises(UserError, match="--seq"):
        kv_cli.main(["--preset", "tinygpt-small", "--seq", "0"])


@pytest.mark.parametrize("argv,needle", [
    (["--preset", "llama2-70b-gqa", "--seq", "1" + "0" * 160], "--seq: got '10000000000000000000... (161 characters)'"),
    (["--preset", "llama2-70b-gqa", "--seq", "1e160"], "--seq: got '1e160', expected a positive integer up to 1e15"),
    (["--preset", "llama2-70b-gqa", "--batch", "2.5"], "--batch: got '2.5'"),
    (["--preset", "llama2-70b-gqa", "--dtype", "fp7"], "--dtype: invalid choice: 'fp7'"),
    (["--preset", "llama2-70b-gqa", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_cli_bad_numbers_one_line(argv, needle, capsys):
    """Every bad argument of `attnrepro kv` is one line and exit 2, the huge ones included (no OverflowError)."""
    from attnrepro.commands.main import main

    assert main(["kv", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: attnrepro kv: ") and err.count("\n") == 1 and needle in err, err


def test_cli_largest_sizes_still_compute():
    assert kv_cli.count("1e15") == 10**15 and kv_cli.count("4_096") == 4096 and kv_cli.count("4.096e3") == 4096
    s = mem.summary(mem.preset("llama2-70b-mha"), 10**15, 10**15)
    assert s["attn_matrix_gb"] > 0 and s["kv_bytes"] == 2_621_440 * 10**30


def test_cli_subprocess_table_and_error():
    r = subprocess.run([sys.executable, "-m", "attnrepro.commands.kv_calculator", "--layers", "80", "--kv-heads", "8",
                        "--d-head", "128", "--dtype", "fp16", "--seq", "4096", "--batch", "1"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "1,342,177,280 B" in r.stdout and "327,680 B" in r.stdout
    r = subprocess.run([sys.executable, "-m", "attnrepro.commands.kv_calculator", "--preset", "nope"], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.startswith("error: --preset") and r.stderr.count("\n") == 1
