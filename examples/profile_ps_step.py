"""Profile: where a parameter_server step's time goes, on the benchmark's experiment, in one process.

The benchmark's ``parameter_server_1`` row (an in-process cluster of real gRPC
servers: 1 ps, N workers, the coordinator in the same process) trains at
about 0.4x ``one_device``. This breaks one of its steps down, each part
scheduled as closures by the same ``ClusterCoordinator`` (``--per_wait``
closures, then a wait), in alternating blocks (each part goes first in turn):

- ``one_device``: the same step (``Steps.train``) as a plain one-device
  ``tf.function`` on this process's own CPU, over cached batches: the floor;
- ``empty``: a closure that returns the worker's index: scheduling, dispatch, fetch;
- ``read``: a closure that reads every model variable from the ps (and sums each on the worker);
- ``fwd_bwd``: next batch, forward and backward on the worker, variables read, no update;
- ``step``: ``CoordinatorLoop.train``, the real closure (gradient push and the
  optimizer's update on the ps, the step counter, the stats vector);
- ``step_kN``: the same with N train steps per closure (``--steps_per_closure``).

Each line gives ms per train step and its share of the full step (``step``
with the loop's default). ``--per_wait`` also runs every closure part with
one closure per wait, to show what waiting costs. ``--tiny`` shrinks the model
and batch (30-65 s here, mostly start-up and tracing: not in the test suite).

Run: ``python examples/profile_ps_step.py`` (4-5 minutes on the shared 2-core machine).
"""

import argparse
import os
import tempfile
import time

os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")  # before TensorFlow starts


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=1, help="worker tasks of the in-process cluster")
    parser.add_argument("--blocks", type=int, default=4, help="alternating blocks per part")
    parser.add_argument("--steps", type=int, default=16, help="train steps per block")
    parser.add_argument("--per_wait", type=int, nargs="*", default=[16, 1],
                        help="closures scheduled before each wait (the first is the one shares are of)")
    parser.add_argument("--steps_per_closure", type=int, nargs="*", default=[4, 16],
                        help="also time the real step with these train steps per closure")
    parser.add_argument("--tiny", action="store_true",
                        help="a tiny model and batch: a quick check that the script runs")
    parser.add_argument("--trace_dir", default="", help="also write a TF profiler trace of some full steps here")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    from tfdist.strategies import make_strategy, setup_host

    setup_host(inter_op_threads=args.workers + 2)  # as tfdist.bench's parameter_server rows
    import numpy as np
    import tensorflow as tf

    from tfdist.segmentation.config import build_config
    from tfdist.bench.rows import BASE
    from tfdist.deploy.in_process import in_process_cluster
    from tfdist.models import build_from_config
    from tfdist.engine import coordinator_loop as loop_lib
    from tfdist.segmentation.inputs import train_dataset_fn
    from tfdist.segmentation.optimizers import make_optimizer
    from tfdist.segmentation.steps import Steps

    tiny = {"image_size": 16, "base_filters": 4, "depth": 1, "global_batch_size": 4, "train_examples": 32}
    resolver = in_process_cluster(num_workers=args.workers, num_ps=1)
    config = build_config(overrides={
        **BASE, **(tiny if args.tiny else {}), "strategy": "parameter_server", "epochs": 1,
        "steps_per_epoch": 1000, "model_dir": tempfile.gettempdir()})
    train_cfg, batch = config.train, config.train.global_batch_size
    strategy = make_strategy("parameter_server", cluster_resolver=resolver)

    def make_steps():
        model = build_from_config(config.model, config.data)
        optimizer = make_optimizer(train_cfg, config.runtime.precision, 1000)
        optimizer.build(model.trainable_variables)
        return Steps(model=model, optimizer=optimizer, num_classes=config.data.num_classes, global_batch_size=batch)

    with strategy.scope():
        steps = make_steps()
        step_counter = tf.Variable(0, dtype=tf.int64, trainable=False, name="step",
                                   aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    model = steps.model
    size_mb = sum(int(np.prod(v.shape)) for v in model.variables) * 4 / 1e6
    print(f"model: {len(model.variables)} variables ({len(model.trainable_variables)} trainable), {size_mb:.2f} MB; "
          f"optimizer: {len(steps.optimizer.variables)} variables; devices: "
          f"{sorted({v.value.device for v in model.variables})}", flush=True)
    dataset_fn = train_dataset_fn(config, 0, own_order_per_worker=True)
    loops = {k: loop_lib.CoordinatorLoop(strategy=strategy, steps=steps, step_counter=step_counter,
                                         train_dataset_fn=dataset_fn, eval_dataset=None, steps_per_closure=k)
             for k in sorted({1, loop_lib.STEPS_PER_CLOSURE, *args.steps_per_closure})}
    base_loop = loops[1]
    coordinator, iterator = base_loop.coordinator, base_loop._train_iterator

    # (a) the floor: a plain one-device step on this process's CPU, variables local, over cached batches.
    floor = make_steps()
    local = iter(dataset_fn(tf.distribute.InputContext()).take(8).cache().repeat())
    floor_fn = tf.function(lambda it: floor.train(next(it)))

    def one_device(n):
        for _ in range(n):
            result = floor_fn(local)
        result.numpy()

    # The closure parts: each a tf.function the coordinator schedules on a worker.
    @tf.function
    def empty_closure():
        return tf.distribute.coordinator.experimental_get_current_worker_index()

    @tf.function
    def read_closure():
        return tf.add_n([tf.reduce_sum(tf.cast(v.value, tf.float32)) for v in model.variables])

    def forward_backward(batch_):
        images, masks = batch_
        grads, _, per_image = steps._gradients(images, masks)
        return tf.add_n([tf.reduce_sum(g) for g in grads]) + tf.reduce_sum(per_image)

    @tf.function
    def fwd_bwd_closure(it):
        return strategy.reduce("SUM", strategy.run(forward_backward, args=(next(it),)), axis=None)

    def closures(fn, fn_args, per_wait):
        def run(n):
            for start in range(0, n, per_wait):
                remote = [coordinator.schedule(fn, args=fn_args) for _ in range(min(per_wait, n - start))]
                coordinator.join()
                [r.fetch() for r in remote]
        return run

    def real_step(k, per_wait):
        def run(n):
            for start in range(0, n, per_wait):
                loops[k].train(min(per_wait, n - start))
        return run

    main_wait = args.per_wait[0]
    parts = {"one_device": one_device}
    for per_wait in args.per_wait:
        tag = "" if per_wait == main_wait else f" /wait {per_wait}"
        parts.update({
            f"empty{tag}": closures(empty_closure, (), per_wait),
            f"read{tag}": closures(read_closure, (), per_wait),
            f"fwd_bwd{tag}": closures(fwd_bwd_closure, (iterator,), per_wait),
            f"step{tag}": real_step(1, per_wait),
        })
    for k in sorted(set(args.steps_per_closure) - {1}):
        parts[f"step_k{k}"] = real_step(k, max(main_wait, k))

    for run in parts.values():  # trace and warm up
        run(max(2, main_wait))
    counter_before = int(step_counter.numpy())
    ms = dict.fromkeys(parts, 0.0)
    names = list(parts)
    for block in range(args.blocks):
        for name in names[block % len(names):] + names[:block % len(names)]:  # each goes first in turn
            start = time.perf_counter()
            parts[name](args.steps)
            ms[name] += (time.perf_counter() - start) * 1000 / args.steps
    ms = {name: total / args.blocks for name, total in ms.items()}
    trained = sum(args.blocks * args.steps for name in parts if name.startswith("step"))
    if int(step_counter.numpy()) - counter_before != trained:
        raise RuntimeError(f"the step counter missed steps: {trained} trained, "
                           f"{int(step_counter.numpy()) - counter_before} counted")

    full = ms["step"]
    print(f"parameter_server step breakdown ({args.workers} worker(s), global batch {batch}, "
          f"{args.blocks} blocks x {args.steps} steps, {main_wait} closures per wait unless marked):")
    for name, value in ms.items():
        print(f"{name:>20}: {value:8.2f} ms/step  {value / full:6.1%} of step  {batch * 1000 / value:7.1f} images/s")
    print(f"{'derived':>20}: push+update = step - fwd_bwd = {full - ms['fwd_bwd']:.2f} ms; "
          f"compute over the floor = fwd_bwd - read - empty - one_device = "
          f"{ms['fwd_bwd'] - ms['read'] - ms['empty'] - ms['one_device']:.2f} ms")
    if args.trace_dir:
        tf.profiler.experimental.start(args.trace_dir)
        real_step(1, main_wait)(args.steps)
        tf.profiler.experimental.stop()
        print(f"trace: {args.trace_dir}")


if __name__ == "__main__":
    main()
