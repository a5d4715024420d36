"""`attnrepro keep` and `attnrepro restore`: after a run, make it the reference, or put the reference back.

  attnrepro keep [--allow-stale]   regenerate the README's generated parts, then `git add` exactly the
                                   pipeline's git-tracked outputs, dvc.lock and README.md; prints what it
                                   staged and the `git commit` to run (it never commits)
  attnrepro restore [--yes]        put the committed reference back: `git checkout HEAD -- <those paths>`
                                   (new files inside output folders removed), `dvc checkout` of the data/
                                   outputs the DVC cache holds, the others moved aside (ASIDE)

The paths are read from dvc.yaml: every output, metric and plot with `cache: false` (what git
tracks: metrics/, plots/, report/), plus dvc.lock and README.md. DVC-cached outputs (data/: the
corpus, checkpoints) are restored by `dvc checkout` and shared with `dvc push` (docs/remote.md).
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from attnrepro.commands import tool
from attnrepro.config import ArgumentParser, UserError
from attnrepro.files import dvc_entry, dvc_stages, parse_yaml
from attnrepro.staging import STAGING

EXTRA = ("dvc.lock", "README.md", "docs/CRITICAL.md")  # and what report.readme.update writes (its DOCS)


def _run(cmd: list[str], root: Path, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([tool(cmd[0]), *cmd[1:]], cwd=root, capture_output=True, text=True)
    if check and proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise UserError(f"`{shlex.join(cmd)}` failed: {last[-1] if last else f'exit {proc.returncode}'}")
    return proc


def _root(arg: str) -> Path:
    root = Path(arg).resolve()
    if not (root / "dvc.yaml").is_file():
        raise UserError(f"{root}: no dvc.yaml here (run from the repository root, or pass --root)")
    top = _run(["git", "rev-parse", "--show-toplevel"], root, check=False)
    if top.returncode != 0:
        raise UserError(f"{root}: not a git checkout")
    return root


def git_outputs(root: Path) -> list[str]:
    """Every output, metric and plot of dvc.yaml that git tracks (`cache: false`), in dvc.yaml's order."""
    out: list[str] = []
    for st in dvc_stages(root).values():
        for kind in ("outs", "metrics", "plots"):
            for entry in st.get(kind) or []:
                path, opts = dvc_entry(entry)
                if opts.get("cache", True) is False and path not in out:
                    out.append(path)
    return out


def reference_paths(root: Path) -> list[str]:
    return [*git_outputs(root), *EXTRA]


def stale_stages(root: Path) -> dict[str, list[str]]:
    """`dvc status`: stage -> what changed ("changed deps: ...", "changed outs: ..."); {} when clean."""
    proc = _run(["dvc", "status", "--json"], root, check=False)
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise UserError(f"`dvc status` failed: {last[-1] if last else proc.returncode}")
    text = proc.stdout.strip()
    data = json.loads(text[text.index("{"):]) if "{" in text else {}
    out = {}
    for stage, items in data.items():
        what = []
        for item in items:
            if isinstance(item, str):
                what.append(item)
            else:
                for k, v in item.items():
                    what.append(f"{k}: {', '.join(v) if isinstance(v, dict) else v}")
        out[stage.split(":")[-1]] = what
    return out


def _existing(root: Path, paths: list[str]) -> list[str]:
    """The paths that exist in the working tree or that git tracks (a deleted output is staged as deleted)."""
    tracked = set(_run(["git", "ls-files", "--", *paths], root).stdout.split())
    return [p for p in paths if (root / p).exists() or any(t == p or t.startswith(p.rstrip("/") + "/")
                                                          for t in tracked)]




def rerun_advice(root: Path, stale: dict[str, list[str]]) -> str:
    """The cheapest command that brings the stale stages that are not sweeps up to date: each forced
    alone (--single-item), in dvc.yaml's order, so none of them drags a sweep upstream of it along; a
    stale sweep is named apart (its committed outputs stand with --allow-stale)."""
    from attnrepro.run.stage import is_sweep, stage_order  # torch: deferred so that --help answers at once

    stages = dvc_stages(root)
    cheap = [s for s in stage_order(stages) if s in stale and not is_sweep(s)]
    sweeps = [s for s in stale if is_sweep(s)]
    parts = []
    if cheap:
        parts.append(f"rerun them: dvc repro --single-item {' '.join(cheap)} (or keep the outputs as they are with "
                     "--allow-stale)")
    if sweeps:
        parts.append(f"{', '.join(sweeps)} {'is a sweep' if len(sweeps) == 1 else 'are sweeps'} (hours from an "
                     "empty store): keep the committed outputs with --allow-stale, or rerun with dvc repro "
                     f"--single-item {' '.join(sweeps)}")
    return "; ".join(parts) if parts else "rerun them (dvc repro <stage>), or keep them with --allow-stale"


def keep(root: Path, allow_stale: bool, say=print) -> int:
    if (root / STAGING).is_dir() and any((root / STAGING).iterdir()):
        raise UserError(f"{STAGING}/ holds the journal of a stage killed while moving its outputs in: "
                        "attnrepro staging --finish | --discard first")
    stale = stale_stages(root)
    changed_outs = {s: w for s, w in stale.items() if any(x.startswith("changed outs") for x in w)}
    if changed_outs:
        for s, w in changed_outs.items():
            say(f"  {s}: " + "; ".join(w))
        raise UserError("the outputs of " + ", ".join(changed_outs) + " differ from dvc.lock (a stage edited, "
                        "interrupted or not run): rerun them (dvc repro <stage>) or restore (attnrepro restore); "
                        "nothing staged")
    if stale and not allow_stale:
        for s, w in stale.items():
            say(f"  {s}: " + "; ".join(w))
        raise UserError(f"dvc status: {len(stale)} stage{'s' * (len(stale) != 1)} stale ({', '.join(stale)}): "
                        f"the outputs are not what the workspace's code and params make; {rerun_advice(root, stale)}; "
                        "nothing staged")
    from attnrepro.report import readme  # torch: deferred so that --help answers at once

    try:
        readme_changed = not readme.update(root)
    except readme.ReadmeError as e:
        raise UserError(str(e)) from None
    paths = _existing(root, reference_paths(root))
    _run(["git", "add", "-A", "--", *paths], root)
    staged = _run(["git", "diff", "--cached", "--name-status", "--", *paths], root).stdout.splitlines()
    stat = _run(["git", "diff", "--cached", "--shortstat", "--", *paths], root).stdout.strip()
    say(f"keep: README.md's generated parts {'regenerated' if readme_changed else 'already current'}")
    if not staged:
        say("keep: nothing to stage: the outputs, dvc.lock and README.md are the committed reference already")
        return 0
    say(f"keep: staged {len(staged)} file{'s' * (len(staged) != 1)} ({stat}):")
    for line in staged[:40]:
        say("  " + line)
    if len(staged) > 40:
        say(f"  ... and {len(staged) - 40} more (git diff --cached --name-status)")
    if stale:
        say("keep: kept with these stages stale (--allow-stale): " + ", ".join(stale))
    others = [line[3:] for line in _run(["git", "status", "--porcelain", "--untracked-files=no"], root).stdout
              .splitlines() if not any(line[3:] == p or line[3:].startswith(p.rstrip("/") + "/")
                                                        for p in paths)]
    if others:
        say(f"keep: not staged, changed elsewhere ({len(others)}; the code or params that produced this run? "
            "stage them with it): " + ", ".join(others[:8]) + (" ..." if len(others) > 8 else ""))
    say("next:\n  git commit -m 'New reference: <why>'\n"
        "  dvc push && attnrepro store push   # if you share a remote (docs/remote.md): checkpoints, corpus, runs")
    return 0


def dvc_outputs_of_head(root: Path) -> dict[str, str]:
    """The DVC-cached outputs (data/) HEAD's dvc.lock records for the stages of dvc.yaml: {path: md5}. A
    lock entry of a stage dvc.yaml no longer has is stale, and a file inside a folder git tracks is git's."""
    lock = _run(["git", "show", "HEAD:dvc.lock"], root, check=False).stdout
    tracked = git_outputs(root)
    stages = dvc_stages(root)
    out = {}
    for name, st in (parse_yaml(lock, "HEAD:dvc.lock").get("stages") or {}).items() if lock else []:
        for o in (st.get("outs") or []) if name in stages else []:
            path = str(o.get("path", ""))
            if o.get("md5") and not any(path == t or path.startswith(t.rstrip("/") + "/") for t in tracked):
                out[path] = o["md5"]
    return out


def in_dvc_cache(cache: Path, md5: str) -> bool:
    """DVC 3's cache holds the object (a folder: its listing and every file in it)."""
    obj = cache / "files" / "md5" / md5[:2] / md5[2:]
    if not obj.is_file():
        return False
    if md5.endswith(".dir"):
        try:
            return all(in_dvc_cache(cache, e["md5"]) for e in json.loads(obj.read_text(encoding="utf-8")))
        except (ValueError, KeyError, TypeError):
            return False
    return True


ASIDE = ".attnrepro-aside"  # where restore moves the run's data/ outputs DVC cannot give back (git-ignored)


def restore(root: Path, yes: bool, say=print, ask=input, now=None) -> int:
    """Put the committed reference back; ends where `attnrepro check` passes on the reference's own files.
    Its data/ outputs: already the reference's (left), in the DVC cache (`dvc checkout`), or else the run's,
    which no command brings back to the reference's (the DVC remote is empty on a fresh clone): moved
    aside into one folder, since their run records contradict the restored metrics."""
    from datetime import datetime, timezone

    from attnrepro.provenance.lock import out_md5

    status = [line.split("\t", 1) for line in _run(["git", "diff", "--name-status", "--no-renames", "HEAD", "--",
                                                     *reference_paths(root)], root).stdout.splitlines()]
    changed = [f for s, f in status if s != "A"]  # modified or deleted: HEAD's version comes back
    added = [f for s, f in status if s == "A"]  # staged (attnrepro keep), not in HEAD
    new = added + _run(["git", "ls-files", "--others", "--exclude-standard", "--", *git_outputs(root)],
                       root).stdout.split()
    cache = Path(_run(["dvc", "cache", "dir"], root).stdout.strip() or root / ".dvc" / "cache")
    cache = cache if cache.is_absolute() else root / cache
    differ = {p: md5 for p, md5 in dvc_outputs_of_head(root).items()
              if not (root / p).exists() or out_md5(root / p) != md5}
    fetchable = [p for p, md5 in differ.items() if in_dvc_cache(cache, md5)]
    aside = [p for p in differ if p not in fetchable and (root / p).exists()]
    absent = [p for p in differ if p not in fetchable and p not in aside]
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    folder = f"{ASIDE}/{stamp}"
    if changed or new:
        say(f"restore: {len(changed) + len(new)} files of the pipeline's outputs go back to HEAD's "
            "(your changes to them are discarded):")
        for f in changed:
            say(f" {f}" + ("" if (root / f).exists() else " (deleted: brought back)"))
        for f in new:
            say(f" {f} (not in the reference: removed)")
    for f in fetchable:
        say(f"restore: {f}: the reference's version, from the DVC cache (dvc checkout)")
    if aside:
        say(f"restore: {len(aside)} of the run's data/ outputs differ from the reference's, which the DVC cache "
            f"lacks: moved aside into {folder}/ (delete it when you no longer need them):")
        for f in aside:
            say(f" {f}")
    if not (changed or new or aside):
        say("restore: the git-tracked outputs, dvc.lock and README.md are the committed reference already")
    if changed or new or aside:
        if not yes:
            if not sys.stdin.isatty():
                raise UserError("restore discards the changes listed above: pass --yes to confirm (no terminal to ask)")
            if ask("restore the committed reference? [y/N] ").strip().lower() not in ("y", "yes"):
                say("restore: nothing changed")
                return 1
        if changed:
            _run(["git", "checkout", "HEAD", "--", *changed], root)
        if added:
            _run(["git", "rm", "-q", "--cached", "--", *added], root)
        for f in new:
            (root / f).unlink(missing_ok=True)
        for f in aside:
            (root / folder / f).parent.mkdir(parents=True, exist_ok=True)
            (root / f).rename(root / folder / f)
        if aside:
            (root / ASIDE / ".gitignore").write_text("*\n", encoding="utf-8")  # git and dvc ignore the folder
        said = [f"{len(changed)} checked out from HEAD"] * bool(changed) + [f"{len(new)} removed"] * bool(new) \
            + [f"{len(aside)} moved aside into {folder}/"] * bool(aside)
        say("restore: " + ", ".join(said))
    if _run(["git", "diff", "--quiet", "HEAD", "--", "params.yaml"], root, check=False).returncode == 1:
        # params are an input, like code: an edit (or a `dvc exp run -S` applied to the workspace) stays
        say("restore: params.yaml differs from HEAD and is left as it is (dvc status will list the stages "
            "that read the changed params); `git checkout HEAD -- params.yaml` puts the reference's back")
    if fetchable:  # only what the cache can give back: `dvc checkout` deletes an output it cannot restore
        proc = _run(["dvc", "checkout", *fetchable], root, check=False)
        if proc.returncode != 0:
            out = (proc.stdout + proc.stderr).strip()
            say((out + "\n" if out else "") + "restore: `dvc checkout` failed for " + ", ".join(fetchable))
            return 1
        say(f"restore: {len(fetchable)} DVC-tracked output{'s' * (len(fetchable) != 1)} checked out from the "
            "DVC cache")
    if absent:
        say(f"restore: not in this checkout, nor in the DVC cache: {', '.join(absent)} (left absent: dvc pull "
            "fetches them where a remote holds them, dvc repro remakes them)")
    say("next: attnrepro check   # the verdict on the restored reference (about a minute)")
    return 0


def keep_main(argv: list[str]) -> int:
    ap = ArgumentParser(prog="attnrepro keep",
                        description="Make this run the new reference: regenerate README.md's generated parts "
                                    "(the headline, the results, the counts) and `git add` exactly the pipeline's "
                                    "git-tracked outputs (from dvc.yaml: metrics/, plots/, report/), dvc.lock and "
                                    "README.md. It never commits: it prints what it staged and the commit to run.",
                        epilog="Refuses (exit 2, nothing staged) when a stage's outputs differ from dvc.lock, or, "
                               "without --allow-stale, when `dvc status` lists any stage.")
    ap.add_argument("--root", default=".", help="repository root (default: current directory)")
    ap.add_argument("--allow-stale", action="store_true",
                    help="stage even when `dvc status` says some stages' deps or params changed since their outputs")
    args = ap.parse_args(argv)
    return keep(_root(args.root), args.allow_stale)


def restore_main(argv: list[str]) -> int:
    ap = ArgumentParser(prog="attnrepro restore",
                        description="Put the committed reference back: `git checkout HEAD -- <the pipeline's "
                                    "git-tracked outputs, dvc.lock, README.md>`, remove new files inside output "
                                    "folders, then `dvc checkout` of the data/ outputs the DVC cache holds. Lists "
                                    "what it discards and asks first.",
                        epilog=f"A data/ output that differs from the reference's while the DVC cache lacks the "
                               f"reference's version (a fresh clone: the run folders of train, reversal, charlm) is "
                               f"moved aside into {ASIDE}/<time>/, listed first; nothing is deleted that cannot be "
                               "brought back. It ends by naming `attnrepro check`. exit 0 restored (or nothing to "
                               "restore); 1 declined, or dvc checkout failed; 2 bad usage (no terminal to ask and "
                               "no --yes).")
    ap.add_argument("--root", default=".", help="repository root (default: current directory)")
    ap.add_argument("--yes", "-y", action="store_true", help="do not ask (for scripts)")
    args = ap.parse_args(argv)
    return restore(_root(args.root), args.yes)
