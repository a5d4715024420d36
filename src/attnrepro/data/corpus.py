"""The Tang-poetry corpus: fetch, verify, build text, tokenize, split.

Three sources give the same four files of the chinese-poetry collection:
  npm    the npm package (default), fetched with the machine's own `npm pack`
         and checked against its pinned sha512 integrity;
  url    one URL per file, for users with open internet;
  local  a directory that already holds the files (offline use, tests).
Every file's SHA-256 is checked against the pinned value before it is used.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import io
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
import urllib.parse
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from attnrepro.config import UserError, require
from attnrepro.data.tokenizer import PAD, UNK, Tokenizer  # noqa: F401  (re-exported: the corpus' tokenizer)


class CorpusError(UserError):
    """The corpus source is unusable; the message says what and where."""


@dataclass
class CorpusConfig:
    """params `corpus` (no defaults: params.yaml is the only source of values)."""

    source: Literal["npm", "url", "local"]
    npm_package: str
    npm_integrity: str
    npm_dir: str  # where the files sit inside the tarball
    url_template: str  # "{name}" is replaced by each file name (percent-encoded)
    local_dir: str
    files: dict[str, str]  # file name -> sha256
    vocab_size: int
    val_fraction: float

    def validate(self, prefix: str = "corpus") -> None:
        require(len(self.files) > 0, f"{prefix}.files", self.files, "at least one file: sha256")
        for name, digest in self.files.items():
            require(
                len(digest) == 64 and all(c in "0123456789abcdef" for c in digest),
                f"{prefix}.files.{name}",
                digest,
                "a 64-digit lowercase hex SHA-256",
            )
        require(self.vocab_size > 2, f"{prefix}.vocab_size", self.vocab_size, "an integer > 2")
        require(0 < self.val_fraction < 1, f"{prefix}.val_fraction", self.val_fraction, "in (0, 1)")
        if self.source == "npm":
            require(
                self.npm_integrity.startswith("sha512-"),
                f"{prefix}.npm_integrity",
                self.npm_integrity,
                "'sha512-<base64>' as printed by npm pack",
            )
        if self.source == "url":
            expected = "an http(s) URL containing {name} (and no other {...} field)"
            try:
                url = self.url_template.format(name="x")
            except (KeyError, IndexError, ValueError):
                url = ""
            require("{name}" in self.url_template and urllib.parse.urlsplit(url).scheme in ("http", "https"),
                    f"{prefix}.url_template", self.url_template, expected)
        if self.source == "local":
            require(bool(self.local_dir), f"{prefix}.local_dir", self.local_dir, "a directory path")


def _digest(path: Path, algorithm: str):
    h = hashlib.new(algorithm)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h


def sha256_file(path: Path) -> str:
    return _digest(path, "sha256").hexdigest()


def npm_integrity(path: Path) -> str:
    """The tarball's integrity as npm prints it: sha512-<base64>."""
    return "sha512-" + base64.b64encode(_digest(path, "sha512").digest()).decode()


NPM_MISSING = ("npm is not on PATH: install Node.js (it brings npm); or set corpus.source: url to download "
               "the files over HTTPS; or, offline, put them in a folder and set corpus.source: local and "
               "corpus.local_dir")
# npm's closing notices, which say where its log went, not what went wrong
_NPM_NOISE = ("A complete log of this run", "Log files were not written", "You can rerun the command with")
_NPM_TOPICS = {"notarget", "404", "network", "enoent", "eresolve", "e404", "eacces", "eperm"}


def npm_failure(stdout: str, stderr: str) -> str:
    """The cause of a failed `npm ... --json`, in one line: npm's error code and summary (from its
    JSON error object, or from its `npm error` / `npm ERR!` lines), never its closing log notice."""
    try:
        err = json.loads(stdout).get("error") or {}
    except (ValueError, AttributeError):
        err = {}
    code, msgs = err.get("code"), [err["summary"]] if err.get("summary") else []
    if not msgs:
        for line in stderr.splitlines():
            m = re.match(r"\s*npm (?:ERR!|error)\s*(.*)", line)
            text = m.group(1).strip() if m else ""
            if not text or text.startswith(_NPM_NOISE) or re.match(r"(errno|syscall)\s", text):
                continue
            c = re.fullmatch(r"code\s+(\S+)", text)
            if c:
                code = code or c.group(1)
                continue
            head, _, rest = text.partition(" ")
            text = rest.strip() if head.lower() in _NPM_TOPICS else text
            if text:
                msgs.append(text)
    if not msgs:  # not npm's format: its last line that is not a log notice
        lines = [ln.strip() for ln in stderr.splitlines() if ln.strip() and _NPM_NOISE[0] not in ln]
        msgs = lines[-1:] or ["no output"]
    text = " ".join(msgs[:2])
    text = text if len(text) <= 300 else text[:297] + "..."
    return f"{code}: {text}" if code else text


def _fetch_npm(cfg: CorpusConfig, dest: Path, work: Path) -> dict:
    npm = shutil.which("npm")
    if npm is None:
        raise CorpusError(NPM_MISSING)
    try:
        proc = subprocess.run(
            [npm, "pack", cfg.npm_package, "--json", "--pack-destination", str(work)],
            capture_output=True, text=True,
        )
    except OSError as e:
        raise CorpusError(f"cannot run {npm}: {e.strerror or e}") from None
    if proc.returncode != 0:
        raise CorpusError(f"npm pack {cfg.npm_package} failed: {npm_failure(proc.stdout, proc.stderr)}")
    tarballs = sorted(work.glob("*.tgz"))
    if len(tarballs) != 1:
        raise CorpusError(f"npm pack {cfg.npm_package} produced no tarball")
    got = npm_integrity(tarballs[0])
    if got != cfg.npm_integrity:
        raise CorpusError(
            f"integrity mismatch for {cfg.npm_package}: pinned {cfg.npm_integrity}, got {got}"
        )
    with tarfile.open(tarballs[0], "r:gz") as tar:
        for name in cfg.files:
            member = f"{cfg.npm_dir}/{name}"
            try:
                src = tar.extractfile(member)
            except KeyError:
                src = None
            if src is None:
                raise CorpusError(f"{member} is missing from {cfg.npm_package}")
            with open(dest / name, "wb") as out:
                shutil.copyfileobj(src, out)
    return {"package": cfg.npm_package, "integrity": got}


def to_uri(url: str) -> str:
    """`url` as an ASCII URI: a non-ASCII host IDNA-encoded, path, query and fragment percent-encoded
    as UTF-8 (全唐诗 -> %E5%85%A8%E5%94%90%E8%AF%97); reserved characters and %XX escapes are kept."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if not netloc.isascii():
        userinfo, at, hostport = netloc.rpartition("@")
        host, colon, port = hostport.partition(":")
        netloc = f"{userinfo}{at}{host.encode('idna').decode('ascii')}{colon}{port}"
    safe = "/:@!$&'()*+,;=%-._~"
    return urllib.parse.urlunsplit((parts.scheme, netloc, urllib.parse.quote(parts.path, safe=safe),
                                    urllib.parse.quote(parts.query, safe=safe + "?"),
                                    urllib.parse.quote(parts.fragment, safe=safe + "?")))


def _fetch_url(cfg: CorpusConfig, dest: Path) -> dict:
    for name in cfg.files:
        url = to_uri(cfg.url_template.format(name=name))
        try:
            with urllib.request.urlopen(url, timeout=60) as r, open(dest / name, "wb") as out:
                shutil.copyfileobj(r, out)
        except (OSError, ValueError, http.client.HTTPException) as e:
            raise CorpusError(f"cannot download {url}: {e}") from None
    return {"url_template": cfg.url_template}


def _fetch_local(cfg: CorpusConfig, dest: Path) -> dict:
    src = Path(cfg.local_dir)
    if not src.is_dir():
        raise CorpusError(f"corpus.local_dir {src} is not a directory")
    if not any(src.iterdir()):
        raise CorpusError(f"corpus.local_dir {src} is empty")
    for name in cfg.files:
        if not (src / name).is_file():
            raise CorpusError(f"{name} is missing from corpus.local_dir {src}")
        shutil.copyfile(src / name, dest / name)
    return {"local_dir": str(src)}


def fetch(cfg: CorpusConfig, dest: Path) -> dict:
    """Put the verified source files into `dest`; return a provenance record."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        if cfg.source == "npm":
            prov = _fetch_npm(cfg, dest, Path(work))
        elif cfg.source == "url":
            prov = _fetch_url(cfg, dest)
        else:
            prov = _fetch_local(cfg, dest)
    hashes = {}
    for name, pinned in cfg.files.items():
        got = sha256_file(dest / name)
        if got != pinned:
            raise CorpusError(f"sha256 mismatch for {name}: pinned {pinned}, got {got}")
        hashes[name] = got
    return {"source": cfg.source, **prov, "sha256": hashes}


def load_poems(paths: list[Path]) -> list[str]:
    """Each poem's paragraphs joined by newlines, in file order."""
    poems = []
    for path in paths:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            poems.extend("\n".join(p["paragraphs"]) for p in data)
        except (ValueError, KeyError, TypeError) as e:
            raise CorpusError(f"{path.name} is not a chinese-poetry JSON file ({e})") from None
    if not poems:
        raise CorpusError("the corpus files hold no poems")
    return poems


# How the text keeps line breaks and how the tokenizer treats them. "unk" is the protocol (§1.18.1's
# counting drops newline, so it encodes as <unk>); the others are the `choices` stage's arms: newline
# its own token, no line breaks at all, and line breaks only between poems (encoded as <unk>).
NEWLINE_RULES = ("unk", "token", "drop", "poems")


def corpus_text(poems: list[str], newline: str = "unk") -> str:
    """The token stream's text: each poem's lines joined by newlines, poems by newlines, unless the
    rule drops them ("drop": none at all; "poems": only between poems)."""
    if newline not in NEWLINE_RULES:
        raise CorpusError(f"newline rule {newline!r}: expected one of {', '.join(NEWLINE_RULES)}")
    if newline == "drop":
        return "".join(p.replace("\n", "") for p in poems)
    if newline == "poems":
        return "\n".join(p.replace("\n", "") for p in poems)
    return "\n".join(poems)


def build(poems: list[str], vocab_size: int, val_fraction: float,
          newline: str = "unk") -> tuple[Tokenizer, dict, dict]:
    """Text -> tokenizer, token arrays {train, val}, and corpus metrics."""
    text = corpus_text(poems, newline)
    tok = Tokenizer.build(text, vocab_size, count_newline=newline == "token")
    ids = tok.encode(text)
    n_val = max(1, int(round(len(ids) * val_fraction)))
    if n_val >= len(ids) - 1:
        raise CorpusError(f"corpus.val_fraction {val_fraction} leaves no training tokens ({len(ids)} in all)")
    chars = Counter(text.replace("\n", ""))
    kept = set(tok.itos[2:])
    n_chars = sum(chars.values())
    metrics = {
        "poems": len(poems),
        "chars": n_chars,
        "tokens": len(ids),
        "distinct_chars": len(chars),
        "vocab_size": len(tok.itos),
        # share of the poems' characters (newlines aside) that the vocabulary keeps
        "coverage": sum(n for c, n in chars.items() if c in kept) / n_chars,
        "unk_rate": float((ids == 1).mean()),
        "train_tokens": len(ids) - n_val,
        "val_tokens": n_val,
    }
    return tok, {"train": ids[: len(ids) - n_val], "val": ids[len(ids) - n_val :]}, metrics


def input_files(tok: Tokenizer, arrays: dict) -> dict[str, bytes]:
    """The files a corpus_lm run reads, byte for byte as the corpus stage writes them:
    {train,val}.npy and vocab.json."""
    out = {}
    for split, ids in arrays.items():
        buf = io.BytesIO()
        np.save(buf, ids)
        out[f"{split}.npy"] = buf.getvalue()
    out["vocab.json"] = json.dumps(tok.itos, ensure_ascii=False, indent=0).encode("utf-8")
    return out


@dataclass
class PreparedCorpus:
    """What the corpus stage writes: the poems (text.txt), the tokenizer (vocab.json), the token
    arrays {train, val}, the provenance record and the corpus metrics."""

    poems: list[str]
    tok: Tokenizer
    arrays: dict
    provenance: dict
    metrics: dict

    def lines(self) -> list[str]:
        """The stage's printed summary line."""
        m = self.metrics
        return [f"corpus: {m['poems']} poems, {m['chars']} characters, "
                f"{m['distinct_chars']} distinct, vocabulary covers {m['coverage']:.1%}"]


def prepare(cfg: CorpusConfig, raw: Path) -> PreparedCorpus:
    """Fetch and verify the source files into `raw`, tokenize and split them; the provenance record
    says where they came from (their hashes) and how the split was made. It holds no time: the
    stage's outputs are byte-identical on every rerun, so a fresh clone's corpus matches dvc.lock."""
    prov = fetch(cfg, raw)
    poems = load_poems([raw / name for name in cfg.files])
    tok, arrays, metrics = build(poems, cfg.vocab_size, cfg.val_fraction)
    prov["split"] = f"last {cfg.val_fraction:g} of the token stream is validation"
    return PreparedCorpus(poems=poems, tok=tok, arrays=arrays, provenance=prov, metrics=metrics)

# ---------------------------------------------------------------- its part of the report

def answer(metrics, all_metrics, dists) -> str:
    if not metrics:
        return ""
    return (f"The pinned text has {metrics.get('poems')} poems, {metrics.get('distinct_chars')} distinct characters and "
            f"{metrics.get('tokens', '—'):,} tokens (a line break encodes as <unk>, §1.18.1); the {metrics.get('vocab_size')}-token vocabulary covers "
            f"{100 * metrics['coverage']:.1f}% of the characters ({100 * metrics.get('unk_rate', 0):.1f}% of tokens are <unk>); "
            f"{metrics.get('train_tokens', 0):,} tokens train, {metrics.get('val_tokens', 0):,} validate.")
