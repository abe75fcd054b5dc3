"""The training loop: N replicas equal one device, resume equals straight, outputs, divergence."""

import contextlib
import dataclasses
import io
import json
from pathlib import Path

import keras
import numpy as np
import pytest
from PIL import Image

from tfdist.segmentation import config as experiment_config
from tfdist.segmentation import run
from tfdist.visualize import PALETTE
from helpers.outputs import checkpoint_values, exported_weights

# A tiny experiment: 32x32 shapes, a 2-level UNet, SGD, no augmentation.
TINY = {
    "image_size": 32, "train_examples": 64, "eval_examples": 16, "base_filters": 4, "depth": 2,
    "global_batch_size": 8, "epochs": 1, "steps_per_epoch": 4, "optimizer": "sgd", "learning_rate": 0.05,
    "log_every": 1, "checkpoint_every": 2, "deterministic": True,
}


def tiny(tmp_path, name, **overrides):
    return experiment_config.build_config(overrides={**TINY, "model_dir": str(tmp_path / name), **overrides})


def train_losses(model_dir):
    rows = [json.loads(line) for line in (Path(model_dir) / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if r["split"] == "train"]


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
def one_device_runs(tmp_path_factory):
    """norm -> (model_dir, summary) of the tiny run on one device, each run once per module."""
    runs = {}

    def get(norm: str = "batch"):
        if norm not in runs:
            path = tmp_path_factory.mktemp(f"one_{norm}")
            runs[norm] = path / "one", run(tiny(path, "one", strategy="one_device", norm=norm), verbose=False)
        return runs[norm]

    return get


@pytest.fixture(scope="module")
def one_device_run(one_device_runs):
    return one_device_runs()


# --norm batch all-reduces the batch statistics; --norm group has none (docs/running.md: --norm): both are exact.
@pytest.mark.parametrize("strategy, norm", [("mirrored", "batch"), ("central_storage", "batch"), ("mirrored", "group")])
def test_two_replicas_equal_one_device_with_the_global_batch(tmp_path, one_device_runs, strategy, norm):
    one_dir, one = one_device_runs(norm)
    summary = run(tiny(tmp_path, strategy, strategy=strategy, cpu_devices=2, norm=norm), verbose=False)
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
    assert experiment_config.build_config(str(model_dir / "params.yaml")).train.model_dir == str(model_dir)


def read_event_tensors(log_dir) -> dict:
    """tag -> [(step, value)] from one TensorBoard log directory, read with TensorBoard's own reader."""
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    events = event_accumulator.EventAccumulator(str(log_dir), size_guidance={event_accumulator.TENSORS: 0})
    events.Reload()
    return {tag: [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in events.Tensors(tag)]
            for tag in events.Tags()["tensors"]}


def test_tensorboard_holds_the_logged_scalars_and_predicted_masks(one_device_run):
    """docs/running.md: tensorboard/ holds the train and eval scalars and predicted masks.

    Every scalar of every metrics.jsonl row is in the split's event files at the row's step, with the
    row's value; the eval images are PNGs of image | true mask | predicted mask, one per preview image.
    """
    model_dir, _ = one_device_run
    rows = [json.loads(line) for line in (model_dir / "metrics.jsonl").read_text().splitlines()]
    for split in ("train", "eval"):
        tensors = read_event_tensors(model_dir / "tensorboard" / split)
        logged = [r for r in rows if r["split"] == split]
        assert logged, split
        expected = {}
        for row in logged:
            for name, value in row.items():
                if name not in ("step", "split", "images") and isinstance(value, (int, float)):
                    expected.setdefault(name, []).append((row["step"], value))
        assert {"loss", "mean_iou", "pixel_accuracy"} <= set(expected)
        for name, points in expected.items():
            got = [(step, float(value)) for step, value in tensors[name]]
            assert [s for s, _ in got] == [s for s, _ in points], (split, name)
            np.testing.assert_allclose([v for _, v in got], [v for _, v in points], rtol=1e-6, err_msg=name)
    images = read_event_tensors(model_dir / "tensorboard" / "eval")["image_true_predicted"]
    assert [step for step, _ in images] == [r["step"] for r in rows if r["split"] == "eval"] == [4]
    (_, value), = images
    width, height, *pngs = value  # tf.summary.image: [width, height, PNG, PNG, ...]
    assert (int(width), int(height), len(pngs)) == (3 * 32, 32, 4)
    grid = np.asarray(Image.open(io.BytesIO(pngs[0])))
    assert grid.shape == (32, 96, 3)
    assert (grid[:, 32:64].reshape(-1, 3)[:, None] == PALETTE[None]).all(-1).any(-1).all()  # the true mask: palette


def test_exported_models_compute_what_the_trained_model_computes(one_device_run):
    """export/ holds the trained model: the SavedModel's serving signature and model.keras give, on the same
    (random, non-zero) batch, the logits of the model restored from the run's last checkpoint."""
    import tensorflow as tf

    from tfdist.models import build_from_config

    model_dir, summary = one_device_run
    config = experiment_config.build_config(str(model_dir / "params.yaml"))
    trained = build_from_config(config.model, config.data)
    latest = tf.train.latest_checkpoint(str(model_dir / "checkpoints"))
    assert latest.endswith(f"ckpt-{summary['steps']}")
    tf.train.Checkpoint(model=trained).restore(latest).expect_partial()
    x = np.random.default_rng(0).random((2, 32, 32, 3), dtype=np.float32)
    reference = np.asarray(trained(x, training=False))
    saved_model = tf.saved_model.load(str(model_dir / "export" / "saved_model"))
    served = saved_model.serve(tf.constant(x))
    keras_model = keras.models.load_model(model_dir / "export" / "model.keras")
    np.testing.assert_allclose(np.asarray(served), reference, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(keras_model(x, training=False)), reference, rtol=1e-5, atol=1e-5)


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

    config = experiment_config.build_config(overrides=TINY)
    dataset = make_dataset(config.data, "train", global_batch_size=8, seed=0, training=True)
    for name in ("mirrored", "central_storage"):
        strategy = make_strategy(name, cpu_devices=2)
        with strategy.scope():
            model = build_unet(image_size=32, num_classes=4, base_filters=4, depth=2)
            model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        history = model.fit(dataset, epochs=1, steps_per_epoch=3, verbose=0)
        assert np.isfinite(history.history["loss"][-1]), name


@contextlib.contextmanager
def op_determinism(enabled: bool):
    """TensorFlow's process-wide op determinism set to ``enabled`` for the block (a deterministic run turns it on)."""
    from tensorflow.python.framework import config as tf_config

    def set_to(on: bool) -> None:
        (tf_config.enable_op_determinism if on else tf_config.disable_op_determinism)()

    before = tf_config.is_op_determinism_enabled()
    set_to(enabled)
    try:
        yield
    finally:
        set_to(before)


def loss_scale_keys(values: dict) -> list[str]:
    """The checkpoint keys of Keras' LossScaleOptimizer state (its dynamic scale and its step counter)."""
    return sorted(k for k in values if k.startswith("optimizer/") and ("dynamic_scale" in k or "step_counter" in k))


@pytest.mark.parametrize(
    "strategy, precision, jit, batch_norm",
    [("mirrored", "mixed_float16", True, True), ("one_device", "mixed_bfloat16", True, True),
     ("mirrored", "float32", True, False)],
)
def test_precision_and_xla_runs_train(tmp_path, caplog, strategy, precision, jit, batch_norm):
    """A run applies --precision (the policy, a loss-scale optimizer for float16 only, float32 variables) and
    trains; --jit_compile with 2 replicas and batch norm is refused with the documented warning and still trains."""
    try:
        with op_determinism(False):
            summary = run(tiny(tmp_path, "p", strategy=strategy, precision=precision, jit_compile=jit,
                               batch_norm=batch_norm, steps_per_epoch=3, deterministic=False), verbose=False)
            policy = keras.mixed_precision.global_policy().name
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert summary["precision"] == policy == precision
    assert np.isfinite(summary["final_loss"]) and np.isfinite(summary["eval"]["loss"])
    import tensorflow as tf

    saved = checkpoint_values(tf.train.latest_checkpoint(str(tmp_path / "p" / "checkpoints")))
    assert saved["log_window/.ATTRIBUTES/VARIABLE_VALUE"].dtype == np.float64  # the log's sums, not a weight
    float_dtypes = {np.asarray(v).dtype for k, v in saved.items()
                    if np.issubdtype(np.asarray(v).dtype, np.floating) and not k.startswith("log_window/")}
    assert float_dtypes == {np.dtype("float32")}  # every model and optimizer variable stays float32
    assert bool(loss_scale_keys(saved)) == (precision == "mixed_float16")  # loss scaling for float16 only
    refused = [r.getMessage() for r in caplog.records if "--jit_compile is ignored" in r.getMessage()]
    assert len(refused) == (1 if strategy == "mirrored" and batch_norm else 0), refused


def test_mixed_float16_computes_in_float16_and_scales_the_loss_dynamically():
    """docs/running.md: mixed_float16 with dynamic loss scaling, logits float32.

    The UNet computes in float16 on float32 variables; a step whose scaled gradients overflow float16 is
    skipped (weights unchanged) and halves the loss scale; a finite step updates the weights and keeps it.
    """
    import tensorflow as tf

    from tfdist.models import build_from_config
    from tfdist.segmentation.optimizers import make_optimizer
    from tfdist.segmentation.steps import Steps

    config = experiment_config.build_config(overrides={**TINY, "precision": "mixed_float16"})
    keras.mixed_precision.set_dtype_policy("mixed_float16")
    try:
        model = build_from_config(config.model, config.data)
        optimizer = make_optimizer(config.train, "mixed_float16", total_steps=4)
        optimizer.build(model.trainable_variables)
        steps = Steps(model=model, optimizer=optimizer, num_classes=4, global_batch_size=8)
        conv = model.get_layer("down0_conv1")
        assert (conv.compute_dtype, conv.kernel.dtype) == ("float16", "float32")
        assert {v.dtype for v in model.variables} == {"float32"}
        rng = np.random.default_rng(0)
        batch = (tf.constant(rng.random((8, 32, 32, 3), dtype=np.float32)),
                 tf.constant(rng.integers(0, 4, (8, 32, 32, 1)), tf.int32))
        assert model(batch[0], training=False).dtype == "float32"
        assert model.get_layer("bottleneck_conv1")(tf.zeros([1, 8, 8, 8])).dtype == "float16"

        def trainable():
            return [v.numpy().copy() for v in model.trainable_variables]

        optimizer.dynamic_scale.assign(2.0**60)  # the scaled gradients overflow float16
        before = trainable()
        steps.train(batch)
        assert float(optimizer.dynamic_scale.numpy()) == 2.0**59
        assert all((a == b).all() for a, b in zip(trainable(), before))  # the step was skipped
        optimizer.dynamic_scale.assign(2.0**10)
        steps.train(batch)
        assert float(optimizer.dynamic_scale.numpy()) == 2.0**10
        assert all(np.isfinite(a).all() for a in trainable())
        assert any((a != b).any() for a, b in zip(trainable(), before))
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


@pytest.mark.parametrize(
    "name, batch_norm, deterministic, compiles, warning",
    [("one_device", True, False, True, None),
     ("one_device", True, True, False, "op determinism is on"),
     ("mirrored", True, False, False, "with 2 replicas and --norm batch: cross-replica statistics"),
     ("mirrored", False, False, True, None)],
)
def test_jit_compile_is_used_where_xla_can_compile_and_refused_with_a_warning_elsewhere(
        caplog, name, batch_norm, deterministic, compiles, warning):
    """--jit_compile compiles the forward and backward pass with XLA, except with op determinism on or with
    several replicas and batch norm, where tfdist says so in one warning and runs it uncompiled."""
    import tensorflow as tf

    from tfdist.models import build_from_config
    from tfdist.strategies import make_strategy
    from tfdist.segmentation.plan import can_jit
    from tfdist.segmentation.optimizers import make_optimizer
    from tfdist.segmentation.steps import Steps

    config = experiment_config.build_config(overrides={**TINY, "strategy": name, "cpu_devices": 2, "jit_compile": True,
                                                "batch_norm": batch_norm, "deterministic": deterministic})
    strategy = make_strategy(name, cpu_devices=2)
    with op_determinism(deterministic):
        assert can_jit(config, strategy) is compiles
        if compiles and strategy.num_replicas_in_sync == 1:  # and the pass XLA compiles is the step's
            model = build_from_config(config.model, config.data)
            steps = Steps(model=model, optimizer=make_optimizer(config.train, "float32", 4), num_classes=4,
                          global_batch_size=8, jit_compile=True)
            images, masks = tf.zeros([8, 32, 32, 3]), tf.zeros([8, 32, 32, 1], tf.int32)
            assert steps._gradients._jit_compile is True  # a tf.function(jit_compile=True)
            assert "HloModule" in steps._gradients.experimental_get_compiler_ir(images, masks)(stage="hlo")
    refused = [r.getMessage() for r in caplog.records if "--jit_compile is ignored" in r.getMessage()]
    assert len(refused) == (0 if warning is None else 1) and all(warning in line for line in refused), refused
    assert can_jit(dataclasses.replace(config, runtime=dataclasses.replace(config.runtime, jit_compile=False)),
                    strategy) is False


def test_a_jit_compile_run_compiles_its_step_with_xla(tmp_path, python):
    """End to end: ``tfdist.train --jit_compile`` runs its step through XLA (TensorFlow logs its first XLA
    compilation at INFO level, shown with TF_CPP_MIN_LOG_LEVEL=0). Where it is refused: the test above."""
    args = ["-m", "tfdist.train", "--strategy=one_device", "--image_size=32", "--train_examples=16",
            "--eval_examples=8", "--base_filters=4", "--depth=2", "--global_batch_size=8", "--steps_per_epoch=1",
            "--epochs=1", "--noexport", "--nodeterministic"]
    compiled = python([*args, "--jit_compile", f"--model_dir={tmp_path / 'xla'}"], env={"TF_CPP_MIN_LOG_LEVEL": "0"})
    assert compiled.returncode == 0, compiled.stderr[-2000:]
    assert "Compiled cluster using XLA" in compiled.stderr and "--jit_compile is ignored" not in compiled.stderr


def test_one_tfdist_step_equals_a_hand_written_step(tmp_path):
    """The reference under every equivalence test: tfdist's train step on one device is the textbook one.

    Written out here with tf.GradientTape: per-pixel sparse cross-entropy summed and divided by the pixels
    and the global batch, Keras' SGD (momentum 0.9, tfdist's SGD) at the cosine-decayed learning rate
    (peak * (1 + cos(pi * step / total)) / 2), on the run's own first batches from the same initial weights.
    Three steps, so that momentum and the schedule count; the batch norm statistics are compared too.
    """
    import math

    import tensorflow as tf

    from tfdist.data import make_dataset
    from tfdist.models import build_from_config

    config = tiny(tmp_path, "ref", strategy="one_device", steps_per_epoch=3, export=False)
    assert (config.train.optimizer, config.train.lr_decay) == ("sgd", "cosine")
    run(config, verbose=False, weights_dir=tmp_path / "w")
    with np.load(tmp_path / "w" / "local.npz") as npz:
        got = [npz[f"arr_{i}"] for i in range(len(npz.files))]

    keras.utils.set_random_seed(config.train.seed)
    model = build_from_config(config.model, config.data)
    optimizer = keras.optimizers.SGD(learning_rate=config.train.learning_rate, momentum=0.9)
    batches = make_dataset(config.data, "train", global_batch_size=8, seed=config.train.seed, training=True)
    for step, (images, masks) in enumerate(batches.take(3)):
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_pixel = keras.losses.sparse_categorical_crossentropy(masks[..., 0], logits, from_logits=True)
            loss = tf.reduce_sum(per_pixel) / (32 * 32) / config.train.global_batch_size
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.learning_rate.assign(config.train.learning_rate * (1 + math.cos(math.pi * step / 3)) / 2)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
    assert_weights_close(got, model.get_weights(), rtol=1e-5)


def interrupted_after(straight: Path, step: int, target: Path) -> None:
    """Make ``target`` what a run of the same config killed right after its checkpoint at ``step`` leaves:
    its params.yaml and that checkpoint, the newest.

    A deterministic run writes the same checkpoint at ``step`` whether or not it then goes on, so the straight
    run's own is the interrupted run's; a real kill would land at a step that depends on timing (the killed
    multi-process runs are tests/cluster/test_faults.py's).
    """
    import shutil

    (target / "checkpoints").mkdir(parents=True)
    shutil.copy(straight / "params.yaml", target / "params.yaml")
    files = list((straight / "checkpoints").glob(f"ckpt-{step}.*"))
    assert {f.suffix for f in files} >= {".index"}
    for f in files:
        shutil.copy(f, target / "checkpoints" / f.name)
    (target / "checkpoints" / "checkpoint").write_text(
        f'model_checkpoint_path: "ckpt-{step}"\nall_model_checkpoint_paths: "ckpt-{step}"\n')


@pytest.mark.parametrize(
    "strategy, precision",
    # one_device in float32 is what the others reduce to (and test_train_cli resumes it in a new process).
    [("one_device", "mixed_float16"), ("mirrored", "float32"), ("central_storage", "float32")],
)
def test_resuming_mid_run_equals_training_straight(tmp_path, strategy, precision):
    """docs/running.md: a run on a model_dir with a checkpoint resumes from it (model, optimizer, step, data position).

    The default optimizer (Adam, cosine decay over the whole run), 4 steps in 2 epochs, relaunched from
    step 3 (mid-epoch, past an eval) with the identical config: the weights, the last step's loss and
    learning rate, and the whole optimizer state (Adam's moments, its step count, under mixed_float16
    the loss scale and its step counter) end as in the straight run.
    """
    import tensorflow as tf

    defaults = experiment_config.TrainConfig()
    assert (defaults.optimizer, defaults.lr_decay) == ("adam", "cosine")
    overrides = dict(strategy=strategy, cpu_devices=2, precision=precision, optimizer=defaults.optimizer,
                     learning_rate=defaults.learning_rate, lr_decay=defaults.lr_decay, epochs=2, steps_per_epoch=2,
                     checkpoint_every=1, export=False)
    try:
        straight = run(tiny(tmp_path, "straight", **overrides), verbose=False, weights_dir=tmp_path / "w1")
        interrupted_after(tmp_path / "straight", 3, tmp_path / "resumed")
        resumed = run(tiny(tmp_path, "resumed", **overrides), verbose=False, weights_dir=tmp_path / "w2")
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    assert (straight["start_step"], resumed["start_step"], resumed["steps"]) == (0, 3, straight["steps"]) == (0, 3, 4)
    with np.load(tmp_path / "w1" / "local.npz") as a, np.load(tmp_path / "w2" / "local.npz") as b:
        assert_weights_close([b[k] for k in b.files], [a[k] for k in a.files], rtol=1e-6)
    last = [[r for r in map(json.loads, (tmp_path / d / "metrics.jsonl").read_text().splitlines())
             if r["split"] == "train"][-1] for d in ("straight", "resumed")]
    assert last[0]["step"] == last[1]["step"] == 4
    np.testing.assert_allclose(last[1]["loss"], last[0]["loss"], rtol=1e-6)
    assert last[1]["learning_rate"] == last[0]["learning_rate"]
    ends = [checkpoint_values(tf.train.latest_checkpoint(str(tmp_path / d / "checkpoints")))
            for d in ("straight", "resumed")]
    assert ends[0].keys() == ends[1].keys()
    assert bool(loss_scale_keys(ends[0])) == (precision == "mixed_float16")
    for key in sorted(k for k in ends[0] if k.startswith(("optimizer/", "step/"))):
        np.testing.assert_allclose(ends[1][key], ends[0][key], rtol=1e-6, atol=1e-9, err_msg=key)


def test_ema_momentum_exports_the_moving_averages_and_replicas_equal_one_device(tmp_path):
    # --ema_momentum keeps Keras' moving average of the weights: the export holds the averages (as Keras' fit
    # leaves a model), the checkpoint keeps the trained weights and the averages apart, and 2 replicas equal one.
    ema = {"ema_momentum": 0.5}
    run(tiny(tmp_path, "one", strategy="one_device", **ema), verbose=False)
    run(tiny(tmp_path, "two", strategy="mirrored", cpu_devices=2, **ema), verbose=False)
    exported = exported_weights(tmp_path / "one")
    assert_weights_close(exported_weights(tmp_path / "two"), exported, rtol=1e-5)
    import tensorflow as tf

    import tfdist.models.unet  # noqa: F401  (registers ReplicaBatchNorm)

    saved = checkpoint_values(tf.train.latest_checkpoint(str(tmp_path / "one" / "checkpoints")))
    trained = [v for k, v in saved.items() if k.startswith("model/") and "VARIABLE_VALUE" in k]
    kept = [v for k, v in saved.items() if k.startswith("optimizer/") and "VARIABLE_VALUE" in k]
    model = keras.models.load_model(tmp_path / "one" / "export" / "model.keras")
    moved = [np.asarray(w) for w in model.trainable_weights if w.shape.num_elements() > 1]
    assert len(moved) >= 4
    for weight in moved:
        assert not any(t.shape == weight.shape and np.allclose(t, weight, atol=1e-7) for t in trained)
        assert any(t.shape == weight.shape and np.allclose(t, weight, atol=1e-6) for t in kept)
