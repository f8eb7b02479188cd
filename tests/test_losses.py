"""Every exported loss against a direct torch.nn.functional call, scripted, on random inputs."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gradbridge.export import losses

pytestmark = pytest.mark.every_torch  # Python-side parity: `make test` runs it on the newest torch too

N, C = 12, 5


def _inputs():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(N, C, generator=g)
    classes = torch.randint(0, C, (N,), generator=g)
    classes[3] = 1
    real = torch.randn(N, C, generator=g)
    probabilities = torch.rand(N, C, generator=g)
    return logits, classes, real, probabilities


LOGITS, CLASSES, REAL, PROBABILITIES = _inputs()
WEIGHTS = [0.5, 1.0, 2.0, 1.5, 0.1]

CASES = [
    ({"name": "mse"}, LOGITS, REAL, lambda p, t: F.mse_loss(p, t)),
    ({"name": "mse", "reduction": "sum"}, LOGITS, REAL, lambda p, t: F.mse_loss(p, t, reduction="sum")),
    ({"name": "l1"}, LOGITS, REAL, lambda p, t: F.l1_loss(p, t)),
    ({"name": "l1", "reduction": "sum"}, LOGITS, REAL, lambda p, t: F.l1_loss(p, t, reduction="sum")),
    ({"name": "smooth_l1", "beta": 0.5}, LOGITS, REAL, lambda p, t: F.smooth_l1_loss(p, t, beta=0.5)),
    ({"name": "smooth_l1", "beta": 0.0, "reduction": "sum"}, LOGITS, REAL,
     lambda p, t: F.smooth_l1_loss(p, t, beta=0.0, reduction="sum")),
    ({"name": "huber", "delta": 0.7}, LOGITS, REAL, lambda p, t: F.huber_loss(p, t, delta=0.7)),
    ({"name": "cross_entropy"}, LOGITS, CLASSES, lambda p, t: F.cross_entropy(p, t)),
    ({"name": "cross_entropy", "weight": WEIGHTS, "label_smoothing": 0.2}, LOGITS, CLASSES,
     lambda p, t: F.cross_entropy(p, t, weight=torch.tensor(WEIGHTS), label_smoothing=0.2)),
    ({"name": "cross_entropy", "ignore_index": 1, "reduction": "sum"}, LOGITS, CLASSES,
     lambda p, t: F.cross_entropy(p, t, ignore_index=1, reduction="sum")),
    ({"name": "nll"}, F.log_softmax(LOGITS, 1), CLASSES, lambda p, t: F.nll_loss(p, t)),
    ({"name": "nll", "weight": WEIGHTS, "ignore_index": 1}, F.log_softmax(LOGITS, 1), CLASSES,
     lambda p, t: F.nll_loss(p, t, weight=torch.tensor(WEIGHTS), ignore_index=1)),
    ({"name": "bce_with_logits"}, LOGITS, PROBABILITIES, lambda p, t: F.binary_cross_entropy_with_logits(p, t)),
    ({"name": "bce_with_logits", "pos_weight": WEIGHTS, "reduction": "sum"}, LOGITS, PROBABILITIES,
     lambda p, t: F.binary_cross_entropy_with_logits(p, t, pos_weight=torch.tensor(WEIGHTS),
                                                reduction="sum")),
]


@pytest.mark.parametrize("spec, prediction, target, expected", CASES,
                         ids=[str(sorted(c[0].items())) for c in CASES])
def test_scripted_loss_equals_functional(spec, prediction, target, expected):
    # Given the scripted loss module and a direct torch.nn.functional call on the same inputs
    module = torch.jit.script(losses.build(spec))
    ours = prediction.clone().requires_grad_(True)
    theirs = prediction.clone().requires_grad_(True)
    # When both compute the loss and its gradient
    loss, reference = module(ours, target), expected(theirs, target)
    (grad,) = torch.autograd.grad([loss], [ours])
    (reference_grad,) = torch.autograd.grad([reference], [theirs])
    # Then both agree exactly (the gradient is what training uses)
    assert torch.equal(loss, reference)
    assert torch.equal(grad, reference_grad)


@pytest.mark.parametrize("spec, message", [
    ({"name": "hinge"}, "Unknown loss 'hinge'; supported: mse, l1"),
    ({"name": "mse", "reduction": "none"}, "Invalid reduction 'none'"),
    ({"name": "cross_entropy", "label_smoothing": 1.5}, "Invalid label_smoothing: 1.5"),
    ({"name": "huber", "delta": 0}, "Invalid delta for huber: 0"),
    ({"name": "mse", "beta": 1.0}, "loss mse: unknown option 'beta'; options: reduction"),
])
def test_bad_loss_specs_are_named(spec, message):
    with pytest.raises(ValueError, match=message):
        losses.build(spec)


def test_torch_loss_modules_map_to_specs():
    spec = losses.spec_of(torch.nn.BCEWithLogitsLoss(pos_weight=torch.tensor([2.0, 0.5]), reduction="sum"))
    assert spec == {"name": "bce_with_logits", "reduction": "sum", "pos_weight": [2.0, 0.5]}
    with pytest.raises(ValueError, match="Unknown loss KLDivLoss"):
        losses.spec_of(torch.nn.KLDivLoss())
