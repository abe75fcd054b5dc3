"""The training loop: N replicas equal one device, resume equals straight, outputs, divergence."""

import json
from pathlib import Path

import keras
import numpy as np
import pytest

from tfdist import config as config_lib
from tfdist.training import run

# A tiny experiment: 32x32 shapes, a 2-level UNet, SGD, no augmentation.
TINY = {
    "image_size": 32, "train_examples": 64, "eval_examples": 16, "base_filters": 4, "depth": 2,
    "global_batch_size": 8, "epochs": 1, "steps_per_epoch": 4, "optimizer": "sgd", "learning_rate": 0.05,
    "log_every": 1, "checkpoint_every": 2, "deterministic": True,
}


def tiny(tmp_path, name, **overrides):
    return config_lib.build_config(overrides={**TINY, "model_dir": str(tmp_path / name), **overrides})


def train_losses(model_dir):
    rows = [json.loads(line) for line in (Path(model_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["split"] == "train"]


def exported_weights(model_dir):
    import tfdist.models  # noqa: F401  (registers ReplicaBatchNorm)

    return keras.models.load_model(Path(model_dir) / "export" / "model.keras").get_weights()


def assert_weights_close(a, b, rtol):
    """Relative difference of all weights together <= rtol, and every weight within 1e-6.

    Per tensor, a relative bound is not meaningful where a gradient is a sum
    that cancels (the logits' bias: terms of ~0.25 summing to ~1e-4), so float32
    rounding in a different summation order is amplified there; measured
    against the whole model it is ~1e-7.
    """
    assert len(a) == len(b)
    flat_a, flat_b = (np.concatenate([np.ravel(w) for w in ws]).astype(np.float64) for ws in (a, b))
    assert np.linalg.norm(flat_a - flat_b) <= rtol * np.linalg.norm(flat_b)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=rtol, atol=1e-6)


@pytest.fixture(scope="module")
def one_device_run(tmp_path_factory):
    path = tmp_path_factory.mktemp("one")
    summary = run(tiny(path, "one", strategy="one_device"), verbose=False)
    return path / "one", summary


@pytest.mark.parametrize("strategy", ["mirrored", "central_storage"])
def test_two_replicas_equal_one_device_with_the_global_batch(tmp_path, one_device_run, strategy):
    one_dir, one = one_device_run
    summary = run(tiny(tmp_path, strategy, strategy=strategy, cpu_devices=2), verbose=False)
    assert summary["num_replicas"] == 2 and one["num_replicas"] == 1
    losses, reference = train_losses(tmp_path / strategy), train_losses(one_dir)
    assert len(losses) == len(reference) == 4
    np.testing.assert_allclose(losses, reference, rtol=1e-5)
    assert_weights_close(exported_weights(tmp_path / strategy), exported_weights(one_dir), rtol=1e-5)


def test_run_writes_every_output(one_device_run):
    model_dir, summary = one_device_run
    for name in ("params.yaml", "metrics.jsonl", "summary.json", "checkpoints/checkpoint",
                 "export/model.keras", "export/saved_model/saved_model.pb"):
        assert (model_dir / name).exists(), name
    assert list((model_dir / "tensorboard" / "train").glob("events.*"))
    assert list((model_dir / "tensorboard" / "eval").glob("events.*"))
    written = json.loads((model_dir / "summary.json").read_text())
    for key in ("strategy", "num_replicas", "global_batch_size", "steps", "final_loss", "images_per_second",
                "wall_seconds"):
        assert key in written, key
    assert set(written["eval"]) >= {"loss", "mean_iou", "pixel_accuracy"}
    assert written["steps"] == 4
    # params.yaml is the resolved config and reads back to the same one.
    assert config_lib.build_config(str(model_dir / "params.yaml")).train.model_dir == str(model_dir)


def test_tensorboard_has_scalars_and_predicted_masks(one_device_run):
    import tensorflow as tf

    model_dir, _ = one_device_run
    tags = set()
    for event_file in (model_dir / "tensorboard" / "eval").glob("events.*"):
        for event in tf.compat.v1.train.summary_iterator(str(event_file)):
            tags.update(v.tag for v in event.summary.value)
    assert {"mean_iou", "loss", "image_true_predicted"} <= tags


def test_saved_model_serves(one_device_run):
    import tensorflow as tf

    model_dir, _ = one_device_run
    served = tf.saved_model.load(str(model_dir / "export" / "saved_model"))
    out = served.serve(tf.zeros([1, 32, 32, 3]))
    assert out.shape == (1, 32, 32, 4)


def test_steps_per_loop_gives_the_same_training(tmp_path, one_device_run):
    one_dir, _ = one_device_run
    run(tiny(tmp_path, "spl", strategy="one_device", steps_per_loop=3, log_every=4), verbose=False)
    assert_weights_close(exported_weights(tmp_path / "spl"), exported_weights(one_dir), rtol=1e-5)


def test_a_finished_run_resumes_to_more_steps(tmp_path):
    first = run(tiny(tmp_path, "r", strategy="one_device", steps_per_epoch=2, export=False), verbose=False)
    assert not (tmp_path / "r" / "export").exists()  # --noexport
    again = run(tiny(tmp_path, "r", strategy="one_device", steps_per_epoch=2, epochs=2), verbose=False)
    assert (first["steps"], again["start_step"], again["steps"]) == (2, 2, 4)
    assert (tmp_path / "r" / "export" / "model.keras").is_file()


def test_resuming_a_different_model_is_refused_before_anything_changes(tmp_path):
    from tfdist.errors import UserError

    run(tiny(tmp_path, "m", strategy="one_device", steps_per_epoch=1), verbose=False)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "m").rglob("*")}
    with pytest.raises(UserError, match=r"model.base_filters=4.*Received: base_filters=8"):
        run(tiny(tmp_path, "m", strategy="one_device", base_filters=8), verbose=False)
    assert before == {p: p.stat().st_mtime_ns for p in (tmp_path / "m").rglob("*")}


def test_keras_fit_works_in_a_tfdist_strategy_scope():
    from tfdist.data import make_dataset
    from tfdist.models import build_unet
    from tfdist.strategies import make_strategy

    config = config_lib.build_config(overrides=TINY)
    dataset = make_dataset(config.data, "train", global_batch_size=8, seed=0, training=True)
    for name in ("mirrored", "central_storage"):
        strategy = make_strategy(name, cpu_devices=2)
        with strategy.scope():
            model = build_unet(image_size=32, num_classes=4, base_filters=4, depth=2)
            model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0)
        assert np.isfinite(history.history["loss"][-1]), name


@pytest.mark.parametrize(
    "strategy, precision, jit, batch_norm",
    [("mirrored", "mixed_float16", False, True), ("one_device", "mixed_bfloat16", True, True),
     ("mirrored", "float32", True, False)],
)
def test_precision_and_xla_runs_train(tmp_path, strategy, precision, jit, batch_norm):
    try:
        summary = run(tiny(tmp_path, "p", strategy=strategy, precision=precision, jit_compile=jit,
                           batch_norm=batch_norm, steps_per_epoch=3, deterministic=False), verbose=False)
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert summary["precision"] == precision
    assert np.isfinite(summary["final_loss"]) and np.isfinite(summary["eval"]["loss"])
