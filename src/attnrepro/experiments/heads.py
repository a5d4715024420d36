"""What the heads of a trained model do (§1.8.5-1.8.6, exercise §1.20.3): params section `heads`.

Per layer/head statistics of the attention maps on fixed validation sequences, head ablation
on §1.8.6's random sequence scored against itself (the measurements: attnrepro.measure.probes), their layer means,
and the most "conditional" head against the uniform causal baseline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnrepro.config import UserError, require, require_positive
from attnrepro.files import read_json
from attnrepro.formatting import md_table
from attnrepro.measure.head_matching import HEAD_STATS, matched_to
from attnrepro.measure.probes import ablate_heads, attention_maps, head_stats
from attnrepro.measure.weights import position_stats
from attnrepro.model.attention_impl import AttentionConfig
from attnrepro.model.transformer import load_checkpoint
from attnrepro.progress import progress
from attnrepro.run.loop import load_tokens
from attnrepro.stats import distribution

CORPUS = Path("data/corpus")
STATS = HEAD_STATS


@dataclass
class HeadsConfig:
    """params `heads` (no defaults: params.yaml is the only source of values)."""

    checkpoint: str  # a run's model.pt (the train stage's d32_scaled); its folder is the DVC dep
    n_seqs: int
    seq_len: int
    seq_seed: int
    ablation_len: int  # §1.8.6: one sequence of this many random tokens, its own target
    ablation_seed: int
    threads: int

    def validate(self, prefix: str = "heads") -> None:
        require(bool(self.checkpoint), f"{prefix}.checkpoint", self.checkpoint, "a checkpoint path")
        require_positive(self, ("n_seqs", "seq_len", "ablation_len", "threads"), prefix)
        require(self.seq_len >= 2, f"{prefix}.seq_len", self.seq_len, "at least 2")


def fixed_sequences(tokens: torch.Tensor, n: int, length: int, seed: int) -> torch.Tensor:
    """n windows of `length` tokens at start positions drawn from a seeded generator."""
    if len(tokens) <= length:
        raise ValueError(f"token stream of {len(tokens)} is too short for sequences of {length}")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, len(tokens) - length, (n,), generator=g)
    return torch.stack([tokens[s: s + length] for s in starts.tolist()])


def chapter_ablation_batch(vocab_size: int, length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """§1.8.6's data: `x = torch.randint(2, 1200, (1, 32))`, scored as `model(x, x)` (each
    position's target is its own input), from a seeded generator instead of the global one."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(2, vocab_size, (1, length), generator=g)
    return x, x


def uniform_distance_std(seq_len: int) -> float:
    """The centroid-distance spread of uniform causal attention over `seq_len` tokens: what the
    growth of the row index alone gives (dist_i = i/2), the baseline a "conditional" head must beat."""
    causal = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.float64))
    return position_stats(causal / causal.sum(-1, keepdim=True))["distance_std"].item()


@dataclass
class HeadsResult:
    metrics: dict  # l<L>h<H>.*, layer<L>.*, base_loss, ..., conditional
    rows: list  # one row per layer and head: STATS, ablation_loss, ablation_delta
    maps: list  # per layer the attention weights (n_seqs, n_head, seq_len, seq_len)
    seqs: torch.Tensor  # the token sequences (n_seqs, seq_len) the maps are of
    itos: list  # the corpus vocabulary (heatmap axes)

    def lines(self) -> list[str]:
        """The stage's printed summary: one line per head, then the most conditional head."""
        out = [f"l{r['layer']}h{r['head']}  entropy {r['entropy']:.3f}  diag {r['diag']:.3f}  prev {r['prev']:.3f}  "
               f"distance {r['distance']:.2f} (sd over positions {r['distance_std']:.2f})  "
               f"ablation {r['ablation_delta']:+.4f}" for r in self.rows]
        c = self.metrics["conditional"]
        out.append(f"most conditional head: l{c['layer']}h{c['head']} (centroid sd {c['distance_std']:.2f}; "
                   f"uniform attention {c['uniform_distance_std']:.2f})")
        return out


def check_lengths(cfg: HeadsConfig, block_size: int) -> None:
    for name in ("seq_len", "ablation_len"):
        if getattr(cfg, name) > block_size:
            raise UserError(f"heads.{name}: got {getattr(cfg, name)}, expected at most the model's block_size "
                            f"{block_size}")


def run(cfg: HeadsConfig, attention: AttentionConfig) -> HeadsResult:
    """The heads of `heads.checkpoint` (whose attention must be params `attention`'s) on the corpus'
    validation stream."""
    model = load_checkpoint(cfg.checkpoint, "heads.checkpoint")
    attention.check_checkpoint(model.cfg.impl, "heads.checkpoint")
    check_lengths(cfg, model.cfg.block_size)
    itos = read_json(CORPUS / "vocab.json")
    seqs = fixed_sequences(load_tokens(CORPUS / "val.npy"), cfg.n_seqs, cfg.seq_len, cfg.seq_seed)
    rows, base, maps = measure(model, cfg, seqs, progress_bar=True)
    return HeadsResult(metrics=heads_metrics(rows, base, model.cfg.n_layer, cfg), rows=rows, maps=maps, seqs=seqs,
                       itos=itos)


def measure(model, cfg: HeadsConfig, seqs: torch.Tensor, progress_bar: bool = False) -> tuple[list[dict], float, list]:
    """Each head's statistics on `seqs` and its ablation (rows), the unablated loss, the attention maps."""
    maps = attention_maps(model, seqs)
    rows = head_stats(maps)
    batches = [chapter_ablation_batch(model.cfg.vocab_size, cfg.ablation_len, cfg.ablation_seed)]
    bar = progress(len(rows), "heads ablation") if progress_bar else None
    base, ablation = ablate_heads(model, batches, tick=(lambda: bar.update(1)) if bar else None)
    if bar:
        bar.close()
    for r, a in zip(rows, ablation):
        r["ablation_loss"], r["ablation_delta"] = a["loss"], a["delta"]
    return rows, base, maps


def heads_metrics(rows: list[dict], base: float, n_layer: int, cfg: HeadsConfig) -> dict:
    """metrics/heads.json from measure()'s rows."""
    metrics = portrait_metrics(rows, n_layer, (*STATS, "ablation_delta"))
    metrics.update({
        "base_loss": base,
        "max_ablation_delta": max(r["ablation_delta"] for r in rows),
        "n_positions": cfg.n_seqs * cfg.seq_len,
    })
    most = max(rows, key=lambda r: r["distance_std"])
    metrics["conditional"] = {"layer": most["layer"], "head": most["head"], "distance_std": most["distance_std"],
                              "uniform_distance_std": uniform_distance_std(cfg.seq_len)}
    return metrics


def portrait_metrics(rows: list[dict], n_layer: int, stats: tuple = STATS) -> dict:
    """metrics/heads.json's portrait part: each head's `stats` (l<L>h<H>), their layer means (layer<L>), the
    layer-1 minus layer-0 mean distance, the largest previous-token weight and the spread of the entropies."""
    metrics = {f"l{r['layer']}h{r['head']}": {k: r[k] for k in stats} for r in rows}
    for li in range(n_layer):
        lr = [r for r in rows if r["layer"] == li]
        metrics[f"layer{li}"] = {k: float(np.mean([r[k] for r in lr])) for k in stats}
    metrics.update({
        "layer1_minus_layer0_distance": (metrics["layer1"]["distance"] - metrics["layer0"]["distance"]
                                         if n_layer > 1 else 0.0),
        "max_prev": max(r["prev"] for r in rows),
        "entropy_spread": max(r["entropy"] for r in rows) - min(r["entropy"] for r in rows),
    })
    return metrics


def seed_portraits(cfg: HeadsConfig, checkpoints: dict[int, Path], reference: int) -> dict:
    """metrics/dist/heads.json: the portrait metrics of one variant's checkpoint at every seed (on the heads
    stage's sequences), each seed's heads named after the head of the `reference` seed's checkpoint (the
    heads stage's own) they play (matched_to): every number of metrics/heads.json at every seed, the seed
    distribution the check and the claims judge them by, instead of a fixed tolerance."""
    seqs = fixed_sequences(load_tokens(CORPUS / "val.npy"), cfg.n_seqs, cfg.seq_len, cfg.seq_seed)
    measured = {}
    for seed, path in checkpoints.items():
        model = load_checkpoint(path, f"the seed {seed} checkpoint")
        check_lengths(cfg, model.cfg.block_size)
        measured[seed] = (*measure(model, cfg, seqs)[:2], model.cfg.n_layer)
    ref = measured[reference][0]
    return distribution({s: heads_metrics(matched_to(ref, rows, STATS), base, n_layer, cfg)
                         for s, (rows, base, n_layer) in measured.items()})

# ---------------------------------------------------------------- its part of the report

def centroid_markdown(metrics: dict) -> str:
    """Exercise 3: where each head's attention centroid sits, and how much it moves between positions."""
    c = metrics.get("conditional")
    if not c:
        return ""
    heads = sorted(k for k in metrics if k.startswith("l") and "h" in k and isinstance(metrics[k], dict))
    out = ["dist_i = Σ_j (i − j) p_ij per query row; its mean and its standard deviation over the positions "
           f"(`stages/heads.py`). Uniform causal attention spreads by {c['uniform_distance_std']:.2f} from the "
           "growth of i alone; a head whose centroid spreads more is \"conditional\" (near for some queries, far "
           "for others).\n"]
    out += md_table(["head", "centroid distance", "its sd over positions", "previous-token weight"],
                    [[h, f"{metrics[h]['distance']:.2f}", f"{metrics[h]['distance_std']:.2f}", f"{metrics[h]['prev']:.3f}"]
                     for h in heads])
    out.append(f"\nMost conditional: **l{c['layer']}h{c['head']}** (sd {c['distance_std']:.2f}, "
               f"{'above' if c['distance_std'] > c['uniform_distance_std'] else 'not above'} the uniform baseline).")
    return "\n".join(out) + "\n\n"


def answer(metrics, all_metrics, dists) -> str:
    heads = {k: v for k, v in (metrics or {}).items() if k.startswith("l") and "h" in k and isinstance(v, dict)
             and "prev" in v}
    if not heads:
        return ""
    prev = max(heads, key=lambda h: (heads[h]["prev"], h))
    abl = max(heads, key=lambda h: (heads[h].get("ablation_delta", 0), h))
    d = metrics.get("layer1_minus_layer0_distance")
    return (f"The heads differ (entropies spread by {metrics.get('entropy_spread', 0):.3f}); {prev} is the clearest "
            f"previous-token head (weight {heads[prev]['prev']:.3f}); ablating {abl} costs the most "
            f"({heads[abl]['ablation_delta']:.3f} nat)"
            + ("" if d is None else f"; layer 1 looks {'farther' if d > 0 else 'no farther'} than layer 0 "
               f"(mean distance {d:+.3f} tokens)") + "." + _heads_over_seeds(dists.get("heads") or {}))


def _heads_over_seeds(dist: dict) -> str:
    """How the same variant's heads come out at the other seeds (metrics/dist/heads.json)."""
    runs = list((dist.get("runs") or {}).values())
    if not runs:
        return ""
    n = len(runs)
    prev = sum(r["max_prev"] > 0.3 for r in runs)
    farther = sum(r["layer1_minus_layer0_distance"] > 0 for r in runs)
    return (f" Over {n} seeds of the same model (each seed's heads matched to this run's by their statistics): a "
            f"head with previous-token weight above 0.3 in {prev}, layer 1 farther than layer 0 in {farther}, "
            f"the largest previous-token weight {min(r['max_prev'] for r in runs):.3f} to "
            f"{max(r['max_prev'] for r in runs):.3f}: which roles a trained model's heads take varies with the seed.")
