"""The digit-reversal task (the companion document ../seeds/000): reverse six digits.

Task (../seeds/000): tokens 0-9 are digits, BOS 10, SEP 11, EOS 12; a sequence is
`BOS d1..d6 SEP d6..d1 EOS` (15 tokens). The model reads the first 14 tokens and
is trained to predict the next token only on the 7 answer targets (six digits and
EOS); the 7 prompt targets carry label -100. At test time the model sees only the
8-token prompt `BOS d1..d6 SEP` and generates 7 tokens greedily (attnrepro.experiments.reversal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch
import torch.nn.functional as F

from attnrepro.model.transformer import TinyGPT
from attnrepro.run.loop import IndexedBatches, TrainingLog
from attnrepro.run.spec import Prepared, RunSpec, with_vocab

VOCAB = 13
BOS, SEP, EOS = 10, 11, 12
N_DIGITS = 6
PROMPT_LEN = N_DIGITS + 2  # BOS d1..d6 SEP
SEQ_LEN = 2 * N_DIGITS + 3  # 15 tokens, 14 model inputs
ANSWER_LEN = N_DIGITS + 1  # six digits and EOS
# answer query positions 7..12 should read the source digits at key positions 6..1
ALIGN_QUERIES = list(range(PROMPT_LEN - 1, PROMPT_LEN - 1 + N_DIGITS))
ALIGN_KEYS = list(range(N_DIGITS, 0, -1))
# with teacher forcing, the label of query i is the input token at i + 1
FUTURE_KEYS = [q + 1 for q in ALIGN_QUERIES]


# ---------------------------------------------------------------- data

def encode(digits: torch.Tensor) -> torch.Tensor:
    """(N, 6) digits -> (N, 15) token sequences BOS d SEP reversed(d) EOS."""
    n = digits.shape[0]
    col = lambda tok: torch.full((n, 1), tok, dtype=torch.long)  # noqa: E731
    return torch.cat([col(BOS), digits, col(SEP), digits.flip(1), col(EOS)], dim=1)


def inputs_labels(seqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs are tokens 0..13; labels tokens 1..14 with the 7 prompt targets set to -100."""
    x = seqs[:, :-1].contiguous()
    y = seqs[:, 1:].clone()
    y[:, : PROMPT_LEN - 1] = -100
    return x, y


def make_splits(n_train: int, n_val: int, n_test: int, seed: int) -> dict[str, torch.Tensor]:
    """Disjoint train/val/test sets of distinct digit strings, as (N, 15) sequences."""
    gen = torch.Generator().manual_seed(seed)
    codes = torch.randperm(10 ** N_DIGITS, generator=gen)[: n_train + n_val + n_test]
    powers = 10 ** torch.arange(N_DIGITS - 1, -1, -1)
    digits = (codes[:, None] // powers) % 10
    seqs = encode(digits)
    return {"train": seqs[:n_train], "val": seqs[n_train:n_train + n_val],
            "test": seqs[n_train + n_val:]}


def batch_indices(n_train: int, steps: int, batch_size: int, seed: int) -> torch.Tensor:
    """The (steps, batch_size) training indices every variant consumes in the same order."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_train, (steps, batch_size), generator=gen)


@torch.no_grad()
def answer_loss(model: TinyGPT, seqs: torch.Tensor, chunk: int = 1024) -> float:
    """Mean cross-entropy over all answer targets of a whole set (eval mode)."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    for i in range(0, len(seqs), chunk):
        x, y = inputs_labels(seqs[i:i + chunk])
        logits, _ = model(x)
        total += F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=-100,
                                 reduction="sum").item()
        count += int((y != -100).sum())
    model.train(was)
    return total / count


@dataclass(frozen=True)
class ReversalData:
    n_train: int
    n_val: int
    n_test: int
    data_seed: int  # which digit strings land in train/val/test


def prepare(spec: RunSpec, inputs: Mapping[str, bytes], device: str) -> Prepared:
    """Digit reversal (no inputs: the data are drawn from seeds). Batches are rows of a
    (steps, batch) index table drawn from batch_seed."""
    d: ReversalData = spec.data
    splits = make_splits(d.n_train, d.n_val, d.n_test, d.data_seed)
    x_all, y_all = inputs_labels(splits["train"])
    indices = batch_indices(d.n_train, spec.steps, spec.optim.batch_size, spec.batch_seed)
    return Prepared(with_vocab(spec), IndexedBatches(x_all.to(device), y_all.to(device), indices), state=splits)


def evaluate(model: TinyGPT, prep: Prepared) -> dict:
    return {"train_loss": answer_loss(model, prep.state["train"]), "val_loss": answer_loss(model, prep.state["val"])}


def before(model: TinyGPT, spec: RunSpec, prep: Prepared) -> dict:
    return {}


def after(model: TinyGPT, spec: RunSpec, prep: Prepared, run: TrainingLog, before: dict) -> tuple[dict, dict]:
    return {"params": model.num_params(), "loss_start": run.history[0]["loss"]}, {}