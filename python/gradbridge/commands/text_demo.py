"""The online demo's transformer variant (`gradbridge online-demo --model text`): a tiny text classifier
(a transformer encoder with dropout, its position ids a constant buffer) learning online in Java from
simulated labels, its online accuracy per window of versions, and the eager replay of its log, dropout
draws included.

The labels come from a known rule (generated, nothing downloaded): the vocabulary's first tokens are
"positive", the next "negative", the rest neutral; a sentence is labelled positive when it holds more
positive than negative tokens. Each round the learner predicts the sentences first (progressive
validation: the version that answered never saw those labels), then the labels go back as feedback.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple

import numpy as np
import torch
from torch import nn

from .. import online
from ..export import export_training_module
from ..replay import ReplayReport, replay

#: The demo's sizes: vocabulary, sentence length, width; tokens [2, 2 + SIGNAL) are positive, the next SIGNAL negative.
VOCAB, LENGTH, WIDTH, SIGNAL, LR = 64, 12, 32, 8, 3e-3


class TextClassifier(nn.Module):
    """Token and position embeddings, one transformer encoder layer (dropout 0.1), mean-pooled, two classes."""

    def __init__(self, vocab: int = VOCAB, length: int = LENGTH, width: int = WIDTH):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(length, width)
        self.register_buffer("position_ids", torch.arange(length).unsqueeze(0), persistent=False)
        self.encoder = nn.TransformerEncoderLayer(width, nhead=2, dim_feedforward=2 * width, dropout=0.1,
                                                  batch_first=True)
        self.head = nn.Linear(width, 2)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        h = self.tokens(input_ids) + self.positions(self.position_ids)
        return self.head(self.encoder(h).mean(dim=1))


class SentenceSimulator:
    """Random sentences and the label the hidden rule gives them."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def sentences(self, batch: int) -> np.ndarray:
        return self.rng.integers(2, VOCAB, size=(batch, LENGTH)).astype(np.int64)

    @staticmethod
    def labels(x: np.ndarray) -> np.ndarray:
        positive = ((x >= 2) & (x < 2 + SIGNAL)).sum(axis=1)
        negative = ((x >= 2 + SIGNAL) & (x < 2 + 2 * SIGNAL)).sum(axis=1)
        return (positive > negative).astype(np.int64)


@dataclass
class TextDemoResult:
    rounds: int
    batch: int
    seconds: float
    #: per window of rounds: (first version, last version, events, online accuracy, log-loss)
    windows: List[Tuple[int, int, int, float, float]]
    log_dir: Path
    replay: ReplayReport

    @property
    def accuracy_rose(self) -> bool:
        return self.windows[-1][3] > self.windows[0][3]


def run_text_demo(rounds: int = 300, batch: int = 32, out_dir: str = "build/online-demo-text",
                  seed: int = 0) -> TextDemoResult:
    """Learn online from ``rounds`` rounds of ``batch`` sentences (predict, then feedback), measure each window's
    online accuracy and log-loss, and replay the log in Python against the eager TextClassifier."""
    out_path = Path(out_dir)
    log_dir = out_path / "log"
    shutil.rmtree(log_dir, ignore_errors=True)
    simulator = SentenceSimulator(seed)
    torch.manual_seed(0)
    model = TextClassifier()
    x0 = simulator.sentences(4)
    model_path = export_training_module(model, "cross_entropy", torch.optim.AdamW(model.parameters(), lr=LR),
                                        out_path / "text.pt", example_inputs=(torch.from_numpy(x0),
                                                                              torch.from_numpy(simulator.labels(x0))))
    learner = online.open_learner(model_path, log_dir, max_batch=batch, max_wait_ms=2, publish_every=1,
                                  checkpoint_every=50, fsync="never")

    def next_round():
        x = simulator.sentences(batch)
        return x, simulator.labels(x)

    def metrics(logits, labels):
        logits = logits.astype(np.float64)
        accuracy = float((logits.argmax(axis=1) == labels).mean())
        return accuracy, float(np.mean(np.logaddexp(logits[:, 0], logits[:, 1]) - logits[np.arange(len(labels)), labels]))

    elapsed, rows = online.progressive(learner, rounds, next_round, metrics)
    return TextDemoResult(rounds, batch, elapsed, rows, log_dir, replay(log_dir, model_path, model=TextClassifier()))
