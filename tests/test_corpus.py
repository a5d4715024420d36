"""corpus: tokenizer, split, metrics and the three sources, on a tiny fake corpus.

Never touches the network: the npm source runs against a fake `npm` executable
that copies a tarball built here.
"""

import io
import json
import os
import shutil
import stat
import sys
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from attnrepro.data import corpus
from attnrepro.config import ConfigError
from attnrepro.data.corpus import CorpusConfig, CorpusError, Tokenizer

from conftest import REPO, call_stage, output_files, run_script

CONTRACT = {"poems", "chars", "distinct_chars", "vocab_size", "coverage", "train_tokens", "val_tokens"}
PARAMS_CORPUS = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))["corpus"]


def corpus_cfg(**kw) -> CorpusConfig:
    """params.yaml's corpus section (the only source of values) with `kw` replaced."""
    return CorpusConfig(**{**PARAMS_CORPUS, **kw})


# --- tokenizer -------------------------------------------------------------------------

def test_tokenizer_ids_and_ranking():
    tok = Tokenizer.build("bbaac\n\n\n", vocab_size=10)
    # §1.18.1: <pad>, <unk>, then by count with newline never counted; b and a tie (2 each): first seen first
    assert tok.itos == ["<pad>", "<unk>", "b", "a", "c"]
    assert tok.encode("ab\nz").tolist() == [3, 2, 1, 1]  # newline and z are both <unk>
    assert tok.decode([3, 2, 1, 0]) == "ab□□"


def test_tokenizer_ties_keep_first_seen_order_as_most_common_does():
    text = "乙甲丙丁" * 3 + "戊"
    tok = Tokenizer.build(text, vocab_size=5)
    assert tok.itos[2:] == ["乙", "甲", "丙"]  # 4 tied characters: the first 3 seen are kept
    assert tok.itos[2:] == [c for c, _ in Counter(text).most_common(3)]
    assert Tokenizer.build("戊" + "丁丙甲乙" * 3, vocab_size=5).itos[2:] == ["丁", "丙", "甲"]


def test_tokenizer_truncates_to_vocab_size():
    tok = Tokenizer.build("aaabbc", vocab_size=4)
    assert tok.itos == ["<pad>", "<unk>", "a", "b"]
    assert tok.encode("c").tolist() == [1]


# --- build: split and metrics ----------------------------------------------------------

def test_build_split_and_metrics(fake_corpus):
    poems = corpus.load_poems(sorted(fake_corpus.dir.glob("*.json"), key=lambda p: int(p.stem.split(".")[-1])))
    assert len(poems) == 48 and all(p.count("\n") == 3 for p in poems)
    tok, arrays, m = corpus.build(poems, vocab_size=40, val_fraction=0.1)
    text = "\n".join(poems)
    ids = tok.encode(text)
    assert CONTRACT <= set(m)
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in m.values())
    assert m["poems"] == 48
    assert m["vocab_size"] == len(tok.itos) == 40
    assert m["chars"] == len(text) - text.count("\n")
    assert m["distinct_chars"] == len(set(text) - {"\n"})
    assert m["distinct_chars"] > 38 and 0 < m["coverage"] < 1
    assert m["val_tokens"] == round(0.1 * len(ids)) and m["train_tokens"] + m["val_tokens"] == len(ids)
    assert len(arrays["train"]) == m["train_tokens"] and len(arrays["val"]) == m["val_tokens"]
    assert np.array_equal(np.concatenate([arrays["train"], arrays["val"]]), ids)
    assert "\n" not in tok.itos and (ids[[i for i, c in enumerate(text) if c == "\n"]] == 1).all()  # <unk>


def test_build_tiny_corpus_split_is_consistent():
    """When val_fraction * tokens rounds to 0 the split must still add up (no empty train).

    Refusing with a CorpusError that names val_fraction is an acceptable answer too.
    """
    try:
        tok, arrays, m = corpus.build(["春眠不覺曉"], vocab_size=10, val_fraction=0.05)
    except CorpusError as e:
        assert "val_fraction" in str(e)
        return
    assert len(arrays["train"]) == m["train_tokens"]
    assert len(arrays["val"]) == m["val_tokens"]
    assert len(arrays["train"]) > 0


def test_load_poems_rejects_bad_json(tmp_path):
    bad = tmp_path / "poet.tang.0.json"
    bad.write_text('[{"title": "x"}]', encoding="utf-8")
    with pytest.raises(CorpusError, match="poet.tang.0.json"):
        corpus.load_poems([bad])


# --- fetch: local source ---------------------------------------------------------------

def local_cfg(d, files, **kw):
    return corpus_cfg(source="local", local_dir=str(d), files=dict(files), vocab_size=40, **kw)


def test_fetch_local_ok(fake_corpus, tmp_path):
    prov = corpus.fetch(local_cfg(fake_corpus.dir, fake_corpus.files), tmp_path / "raw")
    assert prov["source"] == "local" and prov["sha256"] == fake_corpus.files
    assert sorted(p.name for p in (tmp_path / "raw").iterdir()) == sorted(fake_corpus.files)


def test_fetch_local_sha_mismatch(fake_corpus, tmp_path):
    files = dict(fake_corpus.files)
    files["poet.tang.1000.json"] = "0" * 64
    with pytest.raises(CorpusError, match="sha256 mismatch for poet.tang.1000.json"):
        corpus.fetch(local_cfg(fake_corpus.dir, files), tmp_path / "raw")


def test_fetch_local_missing_file(fake_corpus, tmp_path):
    (fake_corpus.dir / "poet.tang.2000.json").unlink()
    with pytest.raises(CorpusError, match="poet.tang.2000.json is missing"):
        corpus.fetch(local_cfg(fake_corpus.dir, fake_corpus.files), tmp_path / "raw")


def test_fetch_local_empty_and_absent_dir(fake_corpus, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="empty"):
        corpus.fetch(local_cfg(tmp_path / "empty", fake_corpus.files), tmp_path / "raw")
    with pytest.raises(CorpusError, match="not a directory"):
        corpus.fetch(local_cfg(tmp_path / "absent", fake_corpus.files), tmp_path / "raw")


# --- fetch: npm source, with a fake npm --------------------------------------------------

def make_tarball(path: Path, corpus_dir: Path, inner="package/dist/quantangshi", skip=()) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for f in sorted(corpus_dir.iterdir()):
            if f.name in skip:
                continue
            data = f.read_bytes()
            info = tarfile.TarInfo(f"{inner}/{f.name}")
            info.size, info.mtime = len(data), 0
            tar.addfile(info, io.BytesIO(data))


def install_fake_npm(bindir: Path, tarball: Path, fail: str = "") -> Path:
    """An `npm` that copies `tarball` into --pack-destination and logs its argv."""
    bindir.mkdir(parents=True, exist_ok=True)
    log = bindir / "npm.log"
    impl = bindir / "fake_npm.py"
    impl.write_text(
        "import json, shutil, sys\n"
        f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"if {fail!r}:\n"
        f"    print('npm ERR! something', file=sys.stderr); print({fail!r}, file=sys.stderr); sys.exit(1)\n"
        "dest = sys.argv[sys.argv.index('--pack-destination') + 1]\n"
        f"shutil.copy({str(tarball)!r}, dest + '/chinese-poetry-2.0.1.tgz')\n"
        "print('[]')\n",
        encoding="utf-8",
    )
    script = bindir / "npm"  # a sh wrapper: no long-shebang limit on the interpreter path
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{impl}" "$@"\n', encoding="utf-8")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return log


@pytest.fixture
def fake_npm(fake_corpus, tmp_path, monkeypatch):
    tarball = tmp_path / "pkg.tgz"
    make_tarball(tarball, fake_corpus.dir)
    bindir = tmp_path / "fakebin"
    log = install_fake_npm(bindir, tarball)
    monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ["PATH"])

    def cfg(**kw):
        base = dict(source="npm", npm_integrity=corpus.npm_integrity(tarball), files=dict(fake_corpus.files),
                    vocab_size=40)
        return corpus_cfg(**{**base, **kw})

    return type("FakeNpm", (), {"tarball": tarball, "bindir": bindir, "log": log, "cfg": staticmethod(cfg)})


def test_fetch_npm_ok(fake_npm, tmp_path):
    prov = corpus.fetch(fake_npm.cfg(), tmp_path / "raw")
    assert prov["integrity"] == corpus.npm_integrity(fake_npm.tarball)
    argv = json.loads(fake_npm.log.read_text().splitlines()[-1])
    assert argv[:2] == ["pack", "chinese-poetry@2.0.1"] and "--pack-destination" in argv


def test_fetch_npm_integrity_mismatch(fake_npm, tmp_path):
    wrong = "sha512-" + "A" * 86 + "=="
    with pytest.raises(CorpusError, match="integrity mismatch for chinese-poetry@2.0.1"):
        corpus.fetch(fake_npm.cfg(npm_integrity=wrong), tmp_path / "raw")


def test_fetch_npm_member_missing(fake_corpus, tmp_path, monkeypatch):
    tarball = tmp_path / "short.tgz"
    make_tarball(tarball, fake_corpus.dir, skip={"poet.tang.3000.json"})
    install_fake_npm(tmp_path / "bin", tarball)
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    cfg = corpus_cfg(source="npm", npm_integrity=corpus.npm_integrity(tarball), files=fake_corpus.files)
    with pytest.raises(CorpusError, match="poet.tang.3000.json is missing"):
        corpus.fetch(cfg, tmp_path / "raw")


def test_fetch_npm_pack_fails(fake_corpus, tmp_path, monkeypatch):
    install_fake_npm(tmp_path / "bin", tmp_path / "none.tgz", fail="npm ERR! 404 Not Found")
    monkeypatch.setenv("PATH", str(tmp_path / "bin") + os.pathsep + os.environ["PATH"])
    cfg = corpus_cfg(source="npm", npm_integrity="sha512-x", files=fake_corpus.files)
    with pytest.raises(CorpusError, match="failed: something Not Found$"):
        corpus.fetch(cfg, tmp_path / "raw")


# npm 11's answers (stdout with --json, stderr) for an unknown version and an unknown package
ETARGET_JSON = json.dumps({"error": {"code": "ETARGET", "summary": "No matching version found for chinese-poetry@9.9.9.",
                                     "detail": "In most cases you or one of your dependencies are requesting..."}})
ETARGET_ERR = ("npm error code ETARGET\n"
               "npm error notarget No matching version found for chinese-poetry@9.9.9.\n"
               "npm error notarget In most cases you or one of your dependencies are requesting\n"
               "npm error A complete log of this run can be found in: /root/.npm/_logs/x-debug-0.log\n")
E404_OLD_ERR = ("npm ERR! code E404\n"
                "npm ERR! 404 Not Found - GET https://npm.example/no-such-pkg - Not found\n"
                "npm ERR! 404\n"
                "npm ERR! 404  'no-such-pkg@*' is not in this registry.\n"
                "\n"
                "npm ERR! A complete log of this run can be found in:\n"
                "npm ERR!     /root/.npm/_logs/x-debug-0.log\n")


@pytest.mark.parametrize("stdout,stderr,expected", [
    (ETARGET_JSON, ETARGET_ERR, "ETARGET: No matching version found for chinese-poetry@9.9.9."),
    ("", ETARGET_ERR, "ETARGET: No matching version found for chinese-poetry@9.9.9. In most cases"),
    ("", E404_OLD_ERR, "E404: Not Found - GET https://npm.example/no-such-pkg - Not found 'no-such-pkg@*' is"),
    ("", "fatal: something else\n", "fatal: something else"),
])
def test_npm_failure_keeps_the_cause(stdout, stderr, expected):
    """npm's error code and first message, never its closing 'A complete log of this run...' notice."""
    got = corpus.npm_failure(stdout, stderr)
    assert got.startswith(expected) and "complete log" not in got and "\n" not in got


def test_fetch_npm_unknown_version_names_etarget(fake_corpus, tmp_path, monkeypatch):
    """A fake npm answering as npm 11 does for chinese-poetry@9.9.9: the error line keeps ETARGET."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "npm").write_text("#!/bin/sh\ncat <<'EOF'\n" + ETARGET_JSON + "\nEOF\ncat >&2 <<'EOF'\n" + ETARGET_ERR
                                + "EOF\nexit 1\n", encoding="utf-8")
    (bindir / "npm").chmod(0o755)
    monkeypatch.setenv("PATH", str(bindir) + os.pathsep + os.environ["PATH"])
    cfg = corpus_cfg(npm_package="chinese-poetry@9.9.9", files=fake_corpus.files)
    with pytest.raises(CorpusError) as e:
        corpus.fetch(cfg, tmp_path / "raw")
    assert str(e.value) == ("npm pack chinese-poetry@9.9.9 failed: ETARGET: No matching version found for "
                            "chinese-poetry@9.9.9.")


# --- fetch: url source ------------------------------------------------------------------

def test_to_uri_percent_encodes_the_path():
    """The template of params.yaml has 全唐诗 in its path: urllib cannot send that as is."""
    assert corpus.to_uri("https://h.example/a/全唐诗/poet.tang.0.json") == \
        "https://h.example/a/%E5%85%A8%E5%94%90%E8%AF%97/poet.tang.0.json"
    assert corpus.to_uri("https://h.example/a%20b/c d?q=诗&r=1#f") == "https://h.example/a%20b/c%20d?q=%E8%AF%97&r=1#f"
    assert corpus.to_uri("http://例え.jp:8080/x") == "http://xn--r8jz45g.jp:8080/x"
    assert corpus.to_uri(PARAMS_CORPUS["url_template"].format(name="poet.tang.0.json")).isascii()


def test_fetch_url_with_a_chinese_path(fake_corpus, tmp_path):
    """source: url against a local HTTP server serving the files under 全唐诗/ (no internet)."""
    import http.server
    import threading
    import urllib.parse

    root = tmp_path / "www"
    shutil.copytree(fake_corpus.dir, root / "全唐诗")
    seen = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def log_message(self, *a):
            seen.append(self.path)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        template = f"http://127.0.0.1:{server.server_port}/全唐诗/{{name}}"
        cfg = corpus_cfg(source="url", url_template=template, files=fake_corpus.files)
        cfg.validate()
        prov = corpus.fetch(cfg, tmp_path / "raw")
        assert prov["sha256"] == fake_corpus.files
        with pytest.raises(CorpusError, match=r"^cannot download http://127\.0\.0\.1:\d+/%E5%85%A8%E5%94%90%E8%AF%97/"
                                              r"old-poet\.tang\.0\.json: HTTP Error 404"):
            corpus.fetch(corpus_cfg(source="url", url_template=template.replace("{name}", "old-{name}"),
                                    files=fake_corpus.files), tmp_path / "raw2")
    finally:
        server.shutdown()
    assert seen and all(p.isascii() and urllib.parse.unquote(p).startswith("/全唐诗/") for p in seen)


@pytest.mark.parametrize("template", ["https://h.example/files", "https://h.example/{name}/{other}",
                                      "ftp://h.example/{name}", "{name}"])
def test_url_template_validated(template):
    with pytest.raises(ConfigError, match=r"^corpus\.url_template: .*http\(s\) URL containing \{name\}"):
        corpus_cfg(source="url", url_template=template).validate()


# --- the stage: exit 2, one line, nothing left behind; and the happy paths ----------------

def write_params(root: Path, corpus_section: dict) -> Path:
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["corpus"] = {**params["corpus"], **corpus_section}
    path = root / "params.yaml"
    path.write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False), encoding="utf-8")
    return path


def assert_failed_cleanly(repo, code, stderr, *needles):
    assert code == 2, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for n in needles:
        assert n in lines[0], lines[0]
    assert output_files(repo) == []
    assert not (repo / "data").exists() or list((repo / "data").iterdir()) == []  # no temp dirs


@pytest.mark.parametrize("case", ["sha256", "missing", "empty"])
def test_stage_bad_local_source(case, fake_corpus, tmp_path, repo_copy):
    files = dict(fake_corpus.files)
    src = fake_corpus.dir
    if case == "sha256":
        files["poet.tang.0.json"] = "f" * 64
        needle = "sha256 mismatch for poet.tang.0.json"
    elif case == "missing":
        (src / "poet.tang.3000.json").unlink()
        needle = "poet.tang.3000.json is missing"
    else:
        src = tmp_path / "empty"
        src.mkdir()
        needle = "is empty"
    params = write_params(tmp_path, {"source": "local", "local_dir": str(src), "files": files,
                                     "vocab_size": 40})
    code, _, err = call_stage("corpus", "--params", params, cwd=repo_copy)
    assert_failed_cleanly(repo_copy, code, err, needle)


def test_stage_npm_integrity_mismatch(fake_npm, tmp_path, repo_copy):
    params = write_params(tmp_path, {"source": "npm", "npm_integrity": "sha512-" + "B" * 86 + "==",
                                     "files": fake_npm.cfg().files, "vocab_size": 40})
    code, _, err = call_stage("corpus", "--params", params, cwd=repo_copy)
    assert_failed_cleanly(repo_copy, code, err, "integrity mismatch")


def test_stage_npm_ok(fake_npm, tmp_path, repo_copy):
    c = fake_npm.cfg()
    params = write_params(tmp_path, {"source": "npm", "npm_integrity": c.npm_integrity, "files": c.files,
                                     "vocab_size": 40})
    code, out, err = call_stage("corpus", "--params", params, cwd=repo_copy)
    assert code == 0, err
    m = json.loads((repo_copy / "metrics/corpus.json").read_text(encoding="utf-8"))
    assert m["poems"] == 48 and m["vocab_size"] == 40
    prov = json.loads((repo_copy / "data/corpus/provenance.json").read_text(encoding="utf-8"))
    assert prov["source"] == "npm" and prov["integrity"] == c.npm_integrity


def test_stage_npm_not_on_path(fake_corpus, tmp_path, repo_copy):
    """Subprocess with a PATH that has python (a wrapper) but no npm."""
    bindir = tmp_path / "pyonly"
    bindir.mkdir()
    wrapper = bindir / "python"
    wrapper.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    keep = [d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "npm").exists()]
    path = os.pathsep.join([str(bindir), *keep])
    assert shutil.which("npm", path=path) is None
    params = write_params(tmp_path, {"files": fake_corpus.files, "vocab_size": 40})  # source: npm
    proc = run_script("stages/corpus.py", "--params", params, cwd=repo_copy, path=path)
    # every option it offers works: url (tested above against a server) and local with local_dir
    assert_failed_cleanly(repo_copy, proc.returncode, proc.stderr, "npm is not on PATH", "corpus.source: url",
                          "corpus.source: local and corpus.local_dir")


def test_stage_local_end_to_end(fake_corpus, tmp_path, repo_copy):
    params = write_params(tmp_path, {"source": "local", "local_dir": str(fake_corpus.dir),
                                     "files": fake_corpus.files, "vocab_size": 40, "val_fraction": 0.1})
    proc = run_script("stages/corpus.py", "--params", params, cwd=repo_copy)
    assert proc.returncode == 0, proc.stderr
    out = repo_copy / "data/corpus"
    assert sorted(p.name for p in out.iterdir()) == [
        "provenance.json", "raw", "text.txt", "train.npy", "val.npy", "vocab.json"]
    assert sorted(p.name for p in (out / "raw").iterdir()) == sorted(fake_corpus.files)
    itos = json.loads((out / "vocab.json").read_text(encoding="utf-8"))
    assert itos[:2] == ["<pad>", "<unk>"] and len(itos) == 40
    text = (out / "text.txt").read_text(encoding="utf-8")
    assert text.startswith("".join(json.loads((fake_corpus.dir / "poet.tang.0.json").read_text(
        encoding="utf-8"))[0]["paragraphs"][:1]))
    ids = np.concatenate([np.load(out / "train.npy"), np.load(out / "val.npy")])
    assert Tokenizer(itos).decode(ids) == Tokenizer(itos).decode(Tokenizer(itos).encode(text.rstrip("\n")))
    m = json.loads((repo_copy / "metrics/corpus.json").read_text(encoding="utf-8"))
    assert CONTRACT <= set(m)
    assert m["poems"] == 48 and m["vocab_size"] == 40
    assert m["train_tokens"] == len(np.load(out / "train.npy")) and m["val_tokens"] == len(np.load(out / "val.npy"))
    env = json.loads((repo_copy / "metrics/env/corpus.json").read_text(encoding="utf-8"))
    assert "torch" in env and "python" in env
    prov = json.loads((out / "provenance.json").read_text(encoding="utf-8"))
    assert prov["source"] == "local" and prov["sha256"] == fake_corpus.files
    assert "validation" in prov["split"]


def test_stage_rerun_is_byte_identical(fake_corpus, tmp_path, repo_copy):
    """Every file of data/corpus, provenance.json included, comes out the same on a rerun: a
    timestamp there changed the folder's hash on every fresh clone, so dvc.lock moved and
    `attnrepro restore` could not check the corpus out again."""
    params = write_params(tmp_path, {"source": "local", "local_dir": str(fake_corpus.dir),
                                     "files": fake_corpus.files, "vocab_size": 40, "val_fraction": 0.1})
    out = repo_copy / "data/corpus"

    def files() -> dict[str, bytes]:
        proc = run_script("stages/corpus.py", "--params", params, cwd=repo_copy)
        assert proc.returncode == 0, proc.stderr
        return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}

    first = files()
    assert "provenance.json" in first
    assert files() == first
