"""Learning rate: the global batch as given, linear scaling with warmup, cosine decay, loss scaling."""

import keras
import pytest

from tfdist.segmentation import config as experiment_config
from tfdist.segmentation.optimizers import WarmupCosine, learning_rate_at, make_optimizer, peak_learning_rate


def train_config(**overrides):
    return experiment_config.build_config(overrides=overrides).train


def test_learning_rate_applies_to_the_global_batch_as_given():
    train = train_config(learning_rate=0.01, global_batch_size=64, lr_decay="none")
    assert peak_learning_rate(train) == 0.01
    assert learning_rate_at(train, 100, 0) == pytest.approx(0.01)


def test_linear_scaling_rule_with_warmup():
    train = train_config(learning_rate=0.01, global_batch_size=64, reference_batch_size=16, lr_scaling="linear",
                         warmup_steps=10, lr_decay="none")
    assert peak_learning_rate(train) == pytest.approx(0.04)  # 0.01 * 64 / 16
    assert learning_rate_at(train, 100, 0) == pytest.approx(0.004)  # 1/10 of the peak at the first step
    assert learning_rate_at(train, 100, 4) == pytest.approx(0.02)
    assert learning_rate_at(train, 100, 9) == pytest.approx(0.04)
    assert learning_rate_at(train, 100, 50) == pytest.approx(0.04)


def test_cosine_decays_to_zero_at_the_last_step():
    schedule = WarmupCosine(1.0, warmup_steps=0, total_steps=100, decay=True)
    assert float(schedule(0)) == pytest.approx(1.0)
    assert float(schedule(50)) == pytest.approx(0.5, abs=1e-6)
    assert float(schedule(100)) == pytest.approx(0.0, abs=1e-6)
    restored = WarmupCosine.from_config(schedule.get_config())
    assert float(restored(25)) == pytest.approx(float(schedule(25)))


def test_optimizers_and_loss_scaling():
    assert isinstance(make_optimizer(train_config(optimizer="sgd"), "float32", 10), keras.optimizers.SGD)
    assert isinstance(make_optimizer(train_config(), "float32", 10), keras.optimizers.Adam)
    scaled = make_optimizer(train_config(), "mixed_float16", 10)
    assert isinstance(scaled, keras.optimizers.LossScaleOptimizer)
    assert not isinstance(make_optimizer(train_config(), "mixed_bfloat16", 10), keras.optimizers.LossScaleOptimizer)
