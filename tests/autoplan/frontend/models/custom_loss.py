"""A model whose forward returns its own scalar loss (autoplan then adds none)."""
import torch
import torch.nn.functional as F
from torch import nn

VOCAB, HIDDEN = 256, 64


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(HIDDEN)
        self.up = nn.Linear(HIDDEN, 2 * HIDDEN, bias=False)
        self.down = nn.Linear(2 * HIDDEN, HIDDEN, bias=False)

    def forward(self, x):
        return x + self.down(F.relu(self.up(self.norm(x))))


class LossModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.Sequential(*(Residual() for _ in range(2)))
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, ids, labels):
        logits = self.head(self.layers(self.embed(ids)))
        return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def build_model():
    return LossModel()


def example_inputs(batch, seq):
    return torch.randint(0, VOCAB, (batch, seq)), torch.randint(0, VOCAB, (batch, seq))
