"""The space of Keras training setups the differential check draws from: one seed, one case, built alike in
every mode (its model, optimizer, data, callbacks and ``fit`` arguments).
"""

from __future__ import annotations

import dataclasses
import math
import random

#: The models of the space, each with the targets it trains on.
MODELS = ("dense", "conv", "embedding", "two_outputs", "dict_inputs", "synchronized_bn", "own_train_step")

#: Models that train on ``x`` alone, with their own ``train_step``: a GAN of two nets and two optimizers with
#: no ``call()`` (keras.io's), an autoencoder (keras.io's VAE's shape). Drawn after every other choice, so that a
#: seed drawn before they were in the space still draws its case.
UNSUPERVISED = ("gan", "autoencoder")

#: Every optimizer of ``keras.optimizers`` that trains a model alone, with a learning rate that trains these
#: models in a few steps, and the options each draws from (``name: (learning rate, {option: choices})``).
OPTIMIZERS = {
    "SGD": (0.05, {"momentum": (0.0, 0.9), "nesterov": (False, True)}),
    "RMSprop": (0.005, {"momentum": (0.0, 0.5), "centered": (False, True)}),
    "Adam": (0.01, {"amsgrad": (False, True)}),
    "AdamW": (0.01, {"weight_decay": (0.004, 0.1)}),
    "Adadelta": (1.0, {"rho": (0.95, 0.9)}),
    "Adagrad": (0.05, {"initial_accumulator_value": (0.1, 0.5)}),
    "Adamax": (0.01, {}),
    "Nadam": (0.01, {}),
    "Ftrl": (0.1, {"l1_regularization_strength": (0.0, 0.01), "l2_regularization_strength": (0.0, 0.01)}),
    "Lion": (0.001, {}),
    "Lamb": (0.01, {}),
    "Adafactor": (0.05, {}),
    "Muon": (0.01, {}),
}

#: Options every optimizer draws from, each off in most cases.
COMMON_OPTIONS = {"use_ema": 0.15, "gradient_accumulation_steps": 0.15, "schedule": 0.2, "loss_scale": 0.1,
                  "weight_decay": 0.1}

#: The clipping options, and the range their thresholds are drawn from (log-uniform): from a threshold that
#: clips every step of these models to one that never clips.
CLIPS = ("clipnorm", "global_clipnorm", "clipvalue")
CLIP_RANGE = (1e-3, 10.0)

#: Callbacks that change what trains.
CALLBACKS = ("ReduceLROnPlateau", "LearningRateScheduler", "EarlyStopping", "SetLearningRate")

#: The other ``keras.callbacks`` classes a ``fit`` takes: those that write files (checked on every worker: what
#: one device writes, the chief's alone) and those that only watch. ``RemoteMonitor`` (a server to post to) and
#: ``SwapEMAWeights`` (``use_ema`` only) are left out.
WATCHERS = ("TensorBoard", "ModelCheckpoint", "CSVLogger", "BackupAndRestore", "TerminateOnNaN", "LambdaCallback",
            "ProgbarLogger")

#: The kinds of input Keras' data adapters take beside numpy arrays and a ``tf.data.Dataset`` (``dataset``).
SOURCES = ("numpy", "pydataset", "generator")

#: The Keras metrics each kind of target draws from (names of ``keras.metrics`` classes, with arguments).
METRICS = {
    "sparse": (("SparseCategoricalAccuracy", {}), ("SparseTopKCategoricalAccuracy", {"k": 2}),
               ("SparseCategoricalCrossentropy", {}), ("accuracy", None)),
    "onehot": (("CategoricalAccuracy", {}), ("TopKCategoricalAccuracy", {"k": 2}), ("AUC", {}),
               ("Precision", {}), ("Recall", {}), ("F1Score", {"average": "macro"}),
               ("FBetaScore", {"beta": 2.0, "average": "weighted"}), ("CategoricalCrossentropy", {}),
               ("KLDivergence", {})),
    "value": (("MeanAbsoluteError", {}), ("MeanSquaredError", {}), ("RootMeanSquaredError", {}),
              ("MeanAbsolutePercentageError", {}), ("LogCoshError", {}), ("R2Score", {})),
}

#: The families of choices a case is made of: a row of the generated matrix is one family's value.
FAMILIES = ("model", "optimizer", "option", "clip", "input", "callback", "metric", "validation", "compile")

CLASSES = 3


@dataclasses.dataclass(frozen=True)
class Case:
    """One training setup, every choice fixed by ``seed`` (``draw``)."""

    seed: int
    model: str
    labels: str  # "sparse", "onehot" or "value"
    optimizer: str
    options: tuple  # ((option, value), ...) for the optimizer's constructor
    schedule: bool
    loss_scale: bool
    clip: tuple | None  # (option, threshold)
    rows: int
    batch: int
    epochs: int
    dataset: bool
    sample_weight: bool
    class_weight: bool
    callback: str | None
    metrics: tuple  # names of METRICS entries
    validation: str | None  # "data" or "split"
    validation_freq: int
    steps_per_execution: int
    jit_compile: bool
    mixed_precision: bool
    source: str = "numpy"  # for inputs that are not a Dataset: numpy, pydataset or generator
    shuffle: bool = False  # Keras' shuffle (numpy rows, a PyDataset's batches)
    initial_epoch: int = 0
    watcher: str | None = None  # one of WATCHERS
    resumed: bool = False  # the first fit stopped by an exception after epoch 1, then fit again (BackupAndRestore)

    @property
    def x_alone(self) -> bool:
        """Whether ``fit`` takes ``x`` alone (no targets)."""
        return self.model in UNSUPERVISED

    def families(self) -> dict[str, list[str]]:
        """``{family: [value, ...]}``: the rows of the generated matrix this case counts in."""
        options = [f"{k}={v}" for k, v in self.options]
        options += ["LearningRateSchedule"] * self.schedule + ["LossScaleOptimizer"] * self.loss_scale
        compiled = [f"steps_per_execution={self.steps_per_execution}"] * (self.steps_per_execution > 1)
        compiled += ["jit_compile=True"] * self.jit_compile + ["mixed_float16"] * self.mixed_precision
        split = self.rows % self.batch
        last = ("divides" if not split else "last batch splits evenly" if split % 2 == 0
                else "last batch splits unevenly")
        kind = "Dataset" if self.dataset else {"numpy": "numpy", "pydataset": "PyDataset",
                                                 "generator": "generator"}[self.source]
        inputs = [kind, last] + ["x alone"] * self.x_alone
        inputs += ["sample_weight"] * self.sample_weight + ["class_weight"] * self.class_weight
        inputs += ["shuffle=True"] * self.shuffle + [f"initial_epoch={self.initial_epoch}"] * bool(self.initial_epoch)
        inputs += ["resumed by BackupAndRestore"] * self.resumed
        return {
            "model": [self.model], "optimizer": [self.optimizer], "option": options,
            "clip": [self.clip[0]] if self.clip else [], "input": inputs,
            "callback": [c for c in (self.callback, self.watcher) if c], "metric": list(self.metrics),
            "validation": ([f"validation_{self.validation}"] if self.validation else [])
                          + [f"validation_freq={self.validation_freq}"] * (self.validation_freq > 1),
            "compile": compiled,
        }

    def describe(self) -> str:
        """The case in one line: its seed and every choice that is on."""
        on = [f"{family}: {', '.join(values)}" for family, values in self.families().items() if values]
        clip = f" {self.clip[0]}={self.clip[1]:.3g}" if self.clip else ""
        return f"case {self.seed}: {self.rows} rows, batch {self.batch}, {self.epochs} epochs{clip}; " + "; ".join(on)


def draw(seed: int) -> Case:
    """The case of ``seed``: the same on every machine and in every process."""
    rng = random.Random(seed)
    model = rng.choice(MODELS)
    labels = {"two_outputs": "sparse", "own_train_step": "value"}.get(model, rng.choice(("sparse", "onehot")))
    optimizer = rng.choice(sorted(OPTIMIZERS))
    _, choices = OPTIMIZERS[optimizer]
    options = [(k, rng.choice(v)) for k, v in sorted(choices.items()) if rng.random() < 0.5]
    on = {k: rng.random() < p for k, p in COMMON_OPTIONS.items()}
    if on["use_ema"]:
        options += [("use_ema", True), ("ema_momentum", 0.9)]
        if rng.random() < 0.4:
            options.append(("ema_overwrite_frequency", 3))
    if on["gradient_accumulation_steps"]:
        options.append(("gradient_accumulation_steps", 2))
    if on["weight_decay"] and "weight_decay" not in dict(options) and optimizer not in ("Muon",):
        options.append(("weight_decay", 0.05))
    clip = None
    if rng.random() < 0.4:
        low, high = (math.log(b) for b in CLIP_RANGE)
        clip = (rng.choice(CLIPS), float(f"{math.exp(rng.uniform(low, high)):.3g}"))
    batch = rng.choice((16, 32))
    steps = rng.choice((2, 3, 4))
    rest = rng.choice((0, 0, 2 * rng.randrange(1, batch // 2), 2 * rng.randrange(0, batch // 2) + 1))
    dataset = model != "own_train_step" and rng.random() < 0.25
    weighted = model not in ("own_train_step",) and not dataset
    sample_weight = weighted and rng.random() < 0.2
    class_weight = weighted and not sample_weight and labels != "value" and model != "two_outputs" \
        and rng.random() < 0.15
    schedule = on["schedule"]
    callback = rng.choice(CALLBACKS) if rng.random() < 0.35 else None
    if schedule and callback in ("ReduceLROnPlateau", "LearningRateScheduler", "SetLearningRate"):
        callback = "EarlyStopping"  # a callback cannot set a LearningRateSchedule's rate (Keras refuses)
    metric_labels = "sparse" if model == "two_outputs" else labels
    metrics = tuple(sorted({rng.choice(METRICS[metric_labels])[0] for _ in range(rng.choice((0, 1, 2)))}))
    validation = rng.choice((None, None, "data", "split")) if not dataset else rng.choice((None, "data"))
    case = Case(
        seed=seed, model=model, labels=labels, optimizer=optimizer, options=tuple(options), schedule=schedule,
        loss_scale=on["loss_scale"], clip=clip, rows=batch * steps + rest, batch=batch,
        epochs=rng.choice((2, 3)), dataset=dataset, sample_weight=sample_weight, class_weight=class_weight,
        callback=callback, metrics=metrics, validation=validation,
        validation_freq=rng.choice((1, 1, 2)) if validation else 1,
        steps_per_execution=rng.choice((1, 1, 1, 2)), jit_compile=rng.random() < 0.08,
        mixed_precision=model in ("dense", "conv") and rng.random() < 0.08,
    )
    return _widened(case, rng)


def _widened(case: Case, rng: random.Random) -> Case:
    """``case`` with the choices drawn after the first ones: the unsupervised models, the other input kinds,
    Keras' shuffle, ``initial_epoch``, a watching callback and a resumed fit."""
    changes = {}
    if rng.random() < 0.2:
        changes = dict(model=rng.choice(UNSUPERVISED), labels="none", metrics=(), sample_weight=False,
                       class_weight=False, validation=None, validation_freq=1, mixed_precision=False,
                       loss_scale=False, jit_compile=False)
        if case.callback in ("EarlyStopping", "ReduceLROnPlateau"):
            changes["callback"] = None  # they watch a loss the unsupervised models name otherwise
    model = changes.get("model", case.model)
    arrays_only = case.sample_weight or case.validation == "split"  # Keras takes them with arrays alone
    if not case.dataset and model not in UNSUPERVISED and not arrays_only and rng.random() < 0.4:
        changes["source"] = rng.choice(SOURCES[1:] if not case.class_weight else ("pydataset",))
    source = changes.get("source", case.source)
    changes["shuffle"] = not case.dataset and source != "generator" and rng.random() < 0.5
    changes["initial_epoch"] = 1 if rng.random() < 0.15 else 0
    watcher = rng.choice(WATCHERS) if rng.random() < 0.35 else None
    if model == "gan" and watcher in ("ModelCheckpoint", "BackupAndRestore"):
        watcher = None  # Keras saves no weights of a model that was never called (it is not built), nor backs it up
    changes["watcher"] = watcher
    changes["resumed"] = watcher == "BackupAndRestore" and rng.random() < 0.6 and not changes["initial_epoch"]
    return dataclasses.replace(case, **changes)


def seeds(cases: int, seed: int) -> list[int]:
    """The seeds of ``cases`` cases of run ``seed``: each case reproduces alone from its own seed."""
    rng = random.Random(seed)
    return [rng.randrange(1, 2**31) for _ in range(cases)]
