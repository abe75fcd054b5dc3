"""``python -m tfdist.bench.fit_profile``: ``tfdist.fit`` against Keras' ``fit`` on one device, in rounds in
one process, on wall and CPU time, as paired ratios.
"""

from __future__ import annotations

import argparse
import statistics


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="rounds of one run of each")
    parser.add_argument("--steps", type=int, default=64, help="timed steps (an epoch is warmup + steps)")
    parser.add_argument("--warmup", type=int, default=4, help="Keras' warm-up steps, as in the benchmark")
    parser.add_argument("--model", default="unet", choices=["unet", "dense", "conv"],
                        help="the UNet, or a small model of the benchmark (both fits then time their second "
                             "epoch whole, by epoch hooks alone)")
    args = parser.parse_args(argv)

    import keras

    import tfdist
    from tfdist.bench.measure import elapsed, keras_experiment, tick
    from tfdist.bench.plan import SMALL_MODELS
    from tfdist.bench.rows import RowSpec

    small = {"model": args.model, "global_batch_size": SMALL_MODELS[args.model]["global_batch_size"]} \
        if args.model != "unet" else {}
    spec = RowSpec(name="fit_profile", kind="keras_fit", steps=args.steps, warmup=args.warmup, overrides=small)
    x, y, model_fn = keras_experiment(spec)
    batch, per_epoch = spec.experiment()["global_batch_size"], args.warmup + args.steps

    class EpochClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ticks: dict = {}

        def on_epoch_begin(self, epoch, logs=None):
            self.ticks[("begin", epoch)] = tick()

        def on_epoch_end(self, epoch, logs=None):
            self.ticks[("end", epoch)] = tick()

    class BatchClock(EpochClock):
        def on_train_batch_end(self, step, logs=None):
            self.ticks[step + 1] = tick()

    def per_step(start, end, steps: int) -> tuple[float, float]:
        wall, cpu = elapsed(start, end)
        return wall / steps, cpu / steps

    def keras_fit():
        if small:
            clock = EpochClock()
            model_fn().fit(x, y, batch_size=batch, epochs=2, callbacks=[clock], verbose=0, shuffle=True)
            return per_step(clock.ticks[("begin", 1)], clock.ticks[("end", 1)], per_epoch)
        clock = BatchClock()
        model_fn().fit(x, y, batch_size=batch, epochs=1, callbacks=[clock], verbose=0, shuffle=True)
        return per_step(clock.ticks[args.warmup], clock.ticks[per_epoch], args.steps)

    def tfdist_fit():
        clock = EpochClock()
        tfdist.fit(model_fn, x, y, batch_size=batch, epochs=2, steps_per_epoch=per_epoch, strategy="one_device",
                   shuffle=True, verbose=0, callbacks=[clock])
        return per_step(clock.ticks[("begin", 1)], clock.ticks[("end", 1)], per_epoch)

    runs = {"keras_fit": keras_fit, "tfdist_fit": tfdist_fit}
    seconds: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for round_ in range(args.rounds):
        for name in list(runs) if round_ % 2 == 0 else list(runs)[::-1]:
            seconds[name].append(runs[name]())
            wall, cpu = seconds[name][-1]
            print(f"round {round_}: {name}: {wall * 1e3:.1f} ms/step wall, {cpu * 1e3:.1f} ms/step CPU", flush=True)
    for clock, index in (("wall", 0), ("CPU", 1)):
        ratios = [k[index] / t[index] for k, t in zip(seconds["keras_fit"], seconds["tfdist_fit"])]
        print(f"tfdist_fit / keras_fit speed, {clock} time, paired by round: {statistics.median(ratios):.3f} "
              f"({min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    main()
