"""DVC stage `precision`: fp32 / fp16 / bf16 behaviour of attention (§1.6.4, §1.11.3, §1.16, §1.17).

Writes metrics/precision.json (numbers only; flags as 0/1), metrics/env/precision.json
and plots/precision/forward.csv (one row per d_head x scaled x softmax x dtype x q/k scale).
Deterministic: every draw is seeded, nothing is timed.

Sections of the metrics file:
  finfo         max, ln(max), eps, tiny per dtype
  round_trip    1.001 stored in fp16 / bf16
  softmax       naive vs stable softmax of softmax_logits in fp64/fp32/fp16/bf16
  overflow      inf count of exp(float32 N(0, std)) over overflow_shape (numpy default_rng)
  four_sigma    the footnote's sqrt(d) logit std, 4 sigma vs ln(65504) = 11.1
  forward_<qk>  attention.attention forward in each dtype: share of non-finite outputs
  mask          additive-mask pitfalls (checkpoint 16)
  accumulation  summing a 4096-position softmax row in low precision (checkpoint 17)
  parity        attention vs F.scaled_dot_product_attention, hand-written backward vs autograd (fp64)
"""

from __future__ import annotations

from attnrepro.envinfo import environment
from attnrepro.experiments import precision
from attnrepro.experiments.precision import PrecisionConfig
from attnrepro.files import write_csv, write_json
from attnrepro.run.stage import Stage, stage


def main(st: Stage) -> None:
    cfg = st.section(PrecisionConfig, "precision")
    st.pin("cpu", cfg.threads, "precision")
    result = precision.run(cfg)
    write_csv("plots/precision/forward.csv", result.rows)
    write_json("metrics/precision.json", result.metrics)
    write_json("metrics/env/precision.json", environment("cpu"))
    for line in result.lines():
        print(line)


if __name__ == "__main__":
    stage(main, __doc__)
