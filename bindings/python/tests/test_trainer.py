"""weft.pipe.Trainer: elastic pipeline training of a TorchScript model, collective on every
rank. The model file is made here exactly as a Python user would: torch.jit.script of an
nn.Sequential, torch.jit.save into a (per-rank) temporary directory."""
import dataclasses

import numpy as np
import pytest
import torch

import weft
import weft.pipe as wp

FEATURES, CLASSES, SAMPLES = 6, 4, 512


@pytest.fixture
def model_path(tmp_path):
    torch.manual_seed(5)
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 16), torch.nn.Tanh(),
        torch.nn.Linear(16, 16), torch.nn.Tanh(),
        torch.nn.Linear(16, 16), torch.nn.Tanh(),
        torch.nn.Linear(16, CLASSES),
    )
    path = tmp_path / "model.pt"
    torch.jit.save(torch.jit.script(model), str(path))
    return path


def clusters(n=SAMPLES):
    """Gaussian clusters, the same on every rank (NumPy float64 inputs, int64 classes)."""
    rng = np.random.default_rng(11)
    centers = 3.0 * rng.standard_normal((CLASSES, FEATURES))
    y = np.arange(n, dtype=np.int64) % CLASSES
    x = centers[y] + rng.standard_normal((n, FEATURES))
    return x, y


def test_trainer_trains_and_transitions(model_path):
    world = weft.size()
    k0 = min(world, 7)
    x, y = clusters()
    with wp.Trainer(model_path, alpha=0.5, batch_size=32, micro_batches=2, lr=1e-2,
                    name="py.train") as trainer:
        assert trainer.line == ""
        plan = trainer.plan
        assert (plan.frozen, plan.k, plan.world) == (0, k0, world)
        metrics = [trainer.train_epoch(x, y) for _ in range(2)]
        for e, m in enumerate(metrics):
            assert isinstance(m, wp.EpochMetrics) and dataclasses.is_dataclass(m)
            assert m.epoch == e and m.samples == SAMPLES
            assert m.loss > 0 and m.train_seconds > 0 and m.samples_per_second > 0
            assert m.micro_batches == 2 and m.k * m.replicas <= world
            assert m.bubble_fraction == pytest.approx((m.k - 1) / (m.micro_batches + m.k - 1))
            assert m.transitioned is True
            assert m.line.startswith(f"PIPE epoch={e} frozen={m.frozen} k={m.k} ")
        m0, m1 = metrics
        assert (m0.frozen, m0.k) == (0, k0)
        assert (m1.frozen, m1.k, m1.replicas) == (m0.next_frozen, m0.next_k, m0.next_replicas)
        assert m1.frozen == 4  # alpha 1/2 over 7 layers
        assert m1.k < m0.k or m1.frozen > m0.frozen
        assert m1.loss < m0.loss
        assert trainer.line == m1.line and "stage_layers=" in m1.line
        plan = trainer.plan
        assert (plan.frozen, plan.k, plan.replicas) == (m1.next_frozen, m1.next_k,
                                                        m1.next_replicas)
        replica, stage = trainer.role
        assert -1 <= replica < plan.replicas and -1 <= stage < plan.k
        if world == 1:
            assert trainer.role == (0, 0)
        # torch tensors work as well as NumPy arrays.
        accuracy = trainer.evaluate(torch.from_numpy(x).float(), torch.from_numpy(y))
        assert accuracy > 0.6  # chance is 0.25
        assert "k=" in repr(trainer)
    with pytest.raises(weft.FailedPreconditionError, match="closed"):
        trainer.train_epoch(x, y)
    trainer.close()  # twice is fine


def test_trainer_decentralized(model_path):
    # Replicas gossip parameters with one peer each step; the run still learns.
    x, y = clusters()
    with wp.Trainer(model_path, alpha=0.5, batch_size=32, micro_batches=2, lr=1e-2,
                    decentralized=True, name="py.gossip") as trainer:
        for _ in range(3):
            m = trainer.train_epoch(x, y)
        assert m.epoch == 2
        assert trainer.evaluate(x, y) > 0.6  # chance is 0.25


def test_trainer_mse_sgd_1f1b(model_path):
    x, y = clusters(64)
    onehot = torch.nn.functional.one_hot(torch.from_numpy(y), CLASSES).float()
    trainer = wp.Trainer(str(model_path), loss="mse", optimizer="sgd", momentum=0.9, lr=0.05,
                         freeze=False, schedule="1f1b", batch_size=16, name="py.mse")
    m = trainer.train_epoch(torch.from_numpy(x).float(), onehot)
    assert m.epoch == 0 and m.samples == 64 and m.transitioned is False and m.next_k == 0
    with pytest.raises(weft.InvalidArgumentError, match="MSE"):
        trainer.train_epoch(x, y)  # class indices for an MSE trainer
    with pytest.raises(weft.FailedPreconditionError, match="MSE"):
        trainer.evaluate(x, y)
    trainer.close()


def test_trainer_defaults_come_from_the_library():
    d = wp.default_options("trainer")
    assert d["alpha"] == 1 / 3 and d["batch_size"] == 64 and d["lr"] == 1e-3
    assert d["optimizer"] == wp.OPTIMIZERS["adam"] and d["schedule"] == wp.SCHEDULES["gpipe"]
    assert d["freeze"] is True and d["cache"] is False and d["name"] is None


def test_trainer_errors(model_path, tmp_path):
    missing = tmp_path / "missing.pt"
    with pytest.raises(weft.NotFoundError, match="missing.pt") as info:
        wp.Trainer(missing)
    assert str(info.value).startswith("weft_pipe_trainer_create")
    with pytest.raises(weft.InvalidArgumentError, match="optimizer"):
        wp.Trainer(model_path, optimizer="rmsprop")
    with pytest.raises(weft.InvalidArgumentError, match="alpha"):
        wp.Trainer(model_path, alpha=0.0)
    with pytest.raises(weft.InvalidArgumentError, match="k0"):
        wp.Trainer(model_path, k0=weft.size() + 1)
    trainer = wp.Trainer(model_path, name="py.err")
    x, y = clusters(64)
    with pytest.raises(weft.InvalidArgumentError, match="does not fit"):
        trainer.train_epoch(x[:, :5], y)
    with pytest.raises(weft.InvalidArgumentError, match="targets"):
        trainer.train_epoch(x, y[:10])
    with pytest.raises(weft.InvalidArgumentError, match="class indices"):
        trainer.train_epoch(x, y.astype(np.float32))
    trainer.close()


def test_import_weft_loads_neither_libtorch_nor_numpy():
    # The trainer's library (and with it LibTorch) loads with the first Trainer only.
    import subprocess
    import sys
    code = ("import sys, weft\n"
            "maps = open('/proc/self/maps').read()\n"
            "print('torch' in sys.modules, 'numpy' in sys.modules,\n"
            "      'libtorch' in maps, 'libweft_trainer' in maps, 'libweft.so' in maps)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False", "False", "False", "True"], out


def test_trainer_enum_values_are_the_header_s():
    from weft import trainer_lowlevel as t
    assert wp.OPTIMIZERS == {"sgd": t.WEFT_PIPE_OPTIMIZER_SGD, "adam": t.WEFT_PIPE_OPTIMIZER_ADAM,
                             "adamw": t.WEFT_PIPE_OPTIMIZER_ADAMW}
    assert wp.LOSSES == {"cross_entropy": t.WEFT_PIPE_LOSS_CROSS_ENTROPY,
                         "mse": t.WEFT_PIPE_LOSS_MSE}
