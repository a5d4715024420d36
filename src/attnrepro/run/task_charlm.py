"""The char-LM task (the companion document ../seeds/003): its text as a token stream of sorted
distinct characters, repeated, the last fraction held out; train and validation loss on fixed
batches. The experiment (its config, model and measurements) is attnrepro.experiments.charlm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import torch

from attnrepro.config import UserError
from attnrepro.model.transformer import TinyGPT, mean_loss
from attnrepro.run.loop import BatchSampler, TrainingLog, fixed_batches
from attnrepro.run.spec import Prepared, RunSpec, with_vocab


def parse_sentences(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]


def join_text(sentences: list[str]) -> str:
    """The document's text: sentences on their own lines inside a leading/trailing newline."""
    return "\n" + "\n".join(sentences) + "\n"


class CharVocab:
    """Sorted distinct characters of the text; unknown characters are an error."""

    def __init__(self, text: str):
        self.itos = sorted(set(text))
        self.stoi = {c: i for i, c in enumerate(self.itos)}

    def __len__(self) -> int:
        return len(self.itos)

    def encode(self, s: str) -> torch.Tensor:
        missing = sorted(set(s) - set(self.stoi))
        if missing:
            raise UserError(f"characters not in the vocabulary: {''.join(missing)!r}")
        return torch.tensor([self.stoi[c] for c in s], dtype=torch.long)

    def decode(self, ids) -> str:
        return "".join(self.itos[int(i)] for i in ids)


def split_stream(text: str, repeat: int, val_fraction: float, vocab: CharVocab):
    """Token stream of text * repeat, split into (train, val) with the last fraction as val."""
    ids = vocab.encode(text * repeat)
    n_val = max(1, int(round(len(ids) * val_fraction)))
    return ids[:-n_val], ids[-n_val:]


@dataclass(frozen=True)
class CharLMData:
    repeat: int  # the text repeated this many times is the token stream
    val_fraction: float  # its last fraction is the validation stream
    eval_batches: int  # fixed evaluation batches of train (eval_seed) and val (eval_seed + 1)
    eval_seed: int


@dataclass
class CharLMState:
    ev_train: list
    ev_val: list


def prepare(spec: RunSpec, inputs: Mapping[str, bytes], device: str) -> Prepared:
    """The companion char LM (input: text, the sentence file)."""
    d: CharLMData = spec.data
    text = join_text(parse_sentences(inputs["text"].decode("utf-8")))
    vocab = CharVocab(text)
    train_ids, val_ids = (t.to(device) for t in split_stream(text, d.repeat, d.val_fraction, vocab))
    mcfg = with_vocab(spec, len(vocab))
    batch = spec.optim.batch_size
    ev_train = fixed_batches(train_ids, mcfg.block_size, batch, d.eval_batches, seed=d.eval_seed)
    ev_val = fixed_batches(val_ids, mcfg.block_size, batch, d.eval_batches, seed=d.eval_seed + 1)
    return Prepared(mcfg, BatchSampler(train_ids, mcfg.block_size, batch, seed=spec.batch_seed, spare=1),
                    state=CharLMState(ev_train, ev_val), checkpoint_extra={"itos": vocab.itos})


def evaluate(model: TinyGPT, prep: Prepared) -> dict:
    return {"train_loss": mean_loss(model, prep.state.ev_train), "val_loss": mean_loss(model, prep.state.ev_val)}


def before(model: TinyGPT, spec: RunSpec, prep: Prepared) -> dict:
    return {}


def after(model: TinyGPT, spec: RunSpec, prep: Prepared, run: TrainingLog, before: dict) -> tuple[dict, dict]:
    return {"params": model.num_params(), "loss_start": run.history[0]["loss"]}, {}