"""The bench's training workloads trained as PyTorch's benchmark runners train a model without a loss of its own
(``training.RunnersLoss``): a Hugging Face model on its own loss over random labels, a TorchBench-style model on
the mean of its outputs; Adam as the runners set it. On the CPU: the setup and one eager step."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from launchless.apps.bench import training, workloads
from launchless.apps.bench.workloads import MEAN_OF_OUTPUTS, MODEL_LOSS, BenchWorkload


def _one_step(
    w: BenchWorkload, expected_of: Callable[[training.TrainingSetup], torch.Tensor]
) -> tuple[training.TrainingSetup, torch.Tensor, torch.Tensor]:
    """One eager step of ``w``'s setup; its loss, and ``expected_of(setup)`` computed from the same state first."""
    s = training.setup(w, device="cpu")
    before = [p.detach().clone() for p in s.model.parameters()]
    torch.manual_seed(5)  # the same dropout draws in both forwards
    with torch.no_grad():
        expected = expected_of(s)
    torch.manual_seed(5)
    loss = training.train_step(s, s.model)(*s.batch)
    moved = any(not torch.equal(b, p) for b, p in zip(before, s.model.parameters(), strict=True))
    assert moved and torch.isfinite(loss)
    return s, loss.detach(), expected


@pytest.mark.zoo
def test_a_model_with_labels_trains_on_its_own_loss_with_adam_as_the_runners_do() -> None:
    w = BenchWorkload("t", "hf:gpt2", kind="training", optimizer="adam", task=MODEL_LOSS)
    s, loss, expected = _one_step(w, lambda s: s.model(input_ids=s.batch[0], labels=s.batch[1], use_cache=False).loss)
    assert isinstance(s.optimizer, torch.optim.Adam) and not s.optimizer.defaults["capturable"]  # on the CPU
    assert s.optimizer.defaults["foreach"] and s.optimizer.defaults["lr"] == 0.01
    ids, labels = s.batch  # the call's tensors in order: its ids, then the random labels the setup added
    assert labels.shape == ids.shape and int(labels.max()) < s.model.config.vocab_size
    assert s.loss.task == MODEL_LOSS and s.loss.names == ["input_ids", "labels"]
    torch.testing.assert_close(loss, expected)  # the model's own loss on those labels


@pytest.mark.zoo
def test_a_model_without_a_loss_trains_on_the_mean_of_its_outputs() -> None:
    w = BenchWorkload("t", "timm:resnet18", kind="training", optimizer="adam", task=MEAN_OF_OUTPUTS)
    s, loss, expected = _one_step(w, lambda s: s.model(*s.batch).mean())
    torch.testing.assert_close(loss, expected)
    assert s.loss.task == MEAN_OF_OUTPUTS and not s.loss.names and s.loss.positional == 1


def test_the_grace_training_workloads_say_where_they_come_from_and_train_as_the_runners_do() -> None:
    trained = [w for w in workloads.suite(workloads.GRACE) if w.kind == "training"]
    assert {w.task for w in trained} == {MEAN_OF_OUTPUTS, MODEL_LOSS}
    assert all(w.optimizer == "adam" and w.origin for w in trained)
    assert dataclasses.replace(trained[0], batch=1).batch == 1
