"""DVC stage `heads`: what the 8 heads of the trained d32_scaled model do (§1.8.5-1.8.6).

On fixed validation sequences: per layer/head mean normalized entropy, diagonal
weight, previous-token weight, mean attention distance and, the chapter's exercise 3
(§1.20.3), the spread over query positions of the attention centroid distance
dist_i = sum_j (i-j) p_ij: a head whose centroid moves a lot between positions (near for
some queries, far for others) is "conditional". Uniform causal attention already spreads
by the growth of i alone (uniform_distance_std); a conditional head spreads more. Also
heatmaps per layer, and head ablation (zero the head's d_head input columns of
attn.proj.weight, loss change on §1.8.6's random sequence scored against itself, restore
bit-exactly).

Writes metrics/heads.json (l<L>h<H>.entropy, ..., .distance_std, layer<L>.*, base_loss,
the most conditional head and the uniform baseline), plots/heads/heads.csv and
plots/heads/layer<L>.png.
"""

from __future__ import annotations

from pathlib import Path

from attnrepro.model.attention_impl import AttentionConfig
from attnrepro.envinfo import environment
from attnrepro.experiments import heads
from attnrepro.experiments.heads import HeadsConfig
from attnrepro.figures import cjk_font, heads_figure
from attnrepro.files import write_csv, write_json
from attnrepro.run.stage import Stage, stage


def main(st: Stage) -> None:
    cfg = st.section(HeadsConfig, "heads")
    st.pin("cpu", cfg.threads, "heads")
    result = heads.run(cfg, st.section(AttentionConfig, "attention"))
    write_json("metrics/heads.json", result.metrics)
    write_json("metrics/env/heads.json", environment("cpu"))
    out = Path("plots/heads")
    write_csv(out / "heads.csv", result.rows)
    for li, w in enumerate(result.maps):
        heads_figure(w, result.seqs.tolist(), result.itos, li, out / f"layer{li}.png")
    if cjk_font() is None:
        print("note: no CJK font found, heatmap axes show token ids")
    for line in result.lines():
        print(line)


if __name__ == "__main__":
    stage(main, __doc__)
