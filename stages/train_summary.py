"""DVC stage `train_summary`: gather the trained variants into metrics/train.json.

Adds the comparison the chapter draws: for each model shape, the loss gap
(unscaled - scaled), and the ratio of the largest d_head's gap to the smallest's.
Samples from every variant go to plots/train/samples.md.
"""

import argparse
from pathlib import Path

from attnrepro.config import ConfigError, read_params, run_stage
from attnrepro.io import read_json, write_json, write_text


def pairs_by_dhead(train_params: dict) -> dict[int, dict[bool, str]]:
    """{d_head: {scaled: variant name}} from train.models and train.variants."""
    out: dict[int, dict[bool, str]] = {}
    for name, v in train_params["variants"].items():
        shape = train_params["models"][v["model"]]
        out.setdefault(shape["d_model"] // shape["n_head"], {})[bool(v["scaled"])] = name
    return out


def comparison(metrics: dict, pairs: dict[int, dict[bool, str]]) -> dict:
    out, gap = {}, {}
    for d_head, pair in sorted(pairs.items()):
        if set(pair) != {True, False}:
            continue
        for key in ("loss_final", "val_loss_final"):
            g = metrics[pair[False]][key] - metrics[pair[True]][key]
            out[f"gap_d{d_head}_{key}"] = g
            gap.setdefault(key, []).append(g)
    for key, gs in gap.items():
        if len(gs) >= 2 and gs[0] != 0:
            out[f"gap_ratio_{key}"] = gs[-1] / gs[0]  # largest d_head over smallest
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--params", default="params.yaml")
    args = ap.parse_args()
    train = read_params(args.params).get("train")
    if not isinstance(train, dict) or not train.get("variants"):
        raise ConfigError("train.variants: missing from params")
    metrics, samples = {}, []
    for name in train["variants"]:
        run = Path("data/train") / name
        if not (run / "summary.json").exists():
            raise ConfigError(f"train.variants.{name}: no trained run at {run} (run `dvc repro train`)")
        metrics[name] = read_json(run / "summary.json")
        samples.append(f"## {name}\n\n```\n{(run / 'sample.txt').read_text(encoding='utf-8').rstrip()}\n```\n")
    metrics["comparison"] = comparison(metrics, pairs_by_dhead(train))
    write_json("metrics/train.json", metrics)
    # every variant ran on this machine with the same settings; one record stands for all
    write_json("metrics/env/train.json", read_json(Path("data/train") / next(iter(train["variants"])) / "env.json"))
    write_text("plots/train/samples.md", "# Samples from the prompt, one per variant\n\n" + "\n".join(samples))
    for k, v in metrics["comparison"].items():
        print(f"{k}: {v:.4f}")


if __name__ == "__main__":
    run_stage(main)
