"""The ``Controller``'s contract with any loop, without TensorFlow: chunks, logs, checkpoints, evals, stops.

A scripted loop stands in for ``SyncLoop``/``CoordinatorLoop`` (the protocol
of ``engine.loop.Loop``): it records the chunks it is asked for and returns
stats vectors ``[loss_sum, examples]``.
"""

from __future__ import annotations

import numpy as np
import pytest

from tfdist.engine.controller import Controller, Schedule, next_boundary
from tfdist.engine.plan import Clock, Hook, Plan
from tfdist.errors import Preempted, TrainingDiverged

BATCH = 4


class CountingSteps:
    """Steps whose stats are ``[loss_sum, examples]``; ``metrics`` reads them (the ``engine.steps.Steps`` protocol)."""

    count_key = "examples"
    stats_size = 2

    def metrics(self, stats):
        loss_sum, examples = float(stats[0]), float(stats[1])
        return {"loss": loss_sum / examples if examples else float("nan"), "examples": int(examples)}

    def describe(self, split, result):
        return f"loss {result['loss']:.4f}"


class ScriptedLoop:
    """A loop whose step ``s`` has loss ``losses(s)``; it records every chunk and can be told to stop."""

    def __init__(self, start=0, losses=lambda step: 1.0, stop_after=None):
        self.steps = CountingSteps()
        self.position = start
        self.losses = losses
        self.stop_after = stop_after
        self.chunks: list[tuple[int, int]] = []
        self.evaluations = 0

    def train(self, num_steps, stop=lambda: False, chunk=None):
        begin, self.position = self.position, self.position + num_steps
        if chunk is not None:  # one task: what it proposes is agreed
            chunk.agreed(chunk.proposal)
        self.chunks.append((begin, self.position))
        loss_sum = sum(self.losses(s) * BATCH for s in range(begin, self.position))
        stopping = self.stop_after is not None and self.position >= self.stop_after
        return np.array([loss_sum, num_steps * BATCH], dtype=np.float64), stopping or stop()

    def step(self):
        return self.position

    def agree(self, flag):
        return flag

    def evaluate(self):
        self.evaluations += 1
        return np.array([0.5 * BATCH, BATCH], dtype=np.float64)

    def predict(self, images):
        return images


class Saves:
    directory = "/nowhere/checkpoints"

    def __init__(self):
        self.saved: list[int] = []

    def save(self, step, window=None):
        self.saved.append(step)

    def restored_window(self):
        return np.zeros(0)

    def latest(self):
        return f"{self.directory}/ckpt-{self.saved[-1]}" if self.saved else None


class Rows:
    def __init__(self):
        self.rows: list[tuple[str, int, dict]] = []

    def log(self, split, step, result):
        self.rows.append((split, step, dict(result)))

    def steps(self, split):
        return [step for s, step, _ in self.rows if s == split]


class Asked:
    """A preemption vote that is never cast, with its reason."""

    @staticmethod
    def vote():
        return False

    def reason(self):
        return "SIGTERM received by local"


def controller(loop, schedule, hooks=(), checkpoints=True, preemption=None):
    plan = Plan(steps=loop.steps, train_dataset_fn=lambda context: None, eval_dataset_fn=lambda context: None,
                learning_rate=lambda step: 0.1, global_batch_size=BATCH, hooks=hooks)
    return Controller(loop=loop, plan=plan, schedule=schedule, checkpoints=Saves() if checkpoints else None,
                      outputs=Rows(), verbose=False, preemption=preemption)


def test_next_boundary_is_the_first_multiple_after_the_step():
    assert [next_boundary(s, 5) for s in (0, 4, 5, 9, 10)] == [5, 5, 10, 10, 15]


def test_chunks_end_on_every_loop_log_checkpoint_and_epoch_boundary():
    loop = ScriptedLoop()
    schedule = Schedule(total_steps=12, steps_per_epoch=6, steps_per_loop=4, log_every=3, checkpoint_every=5)
    c = controller(loop, schedule)
    c.run(0)
    assert loop.chunks == [(0, 3), (3, 5), (5, 6), (6, 9), (9, 10), (10, 12)]
    assert c.outputs.steps("train") == [3, 6, 9, 12]
    assert c.checkpoints.saved == [5, 10, 12]  # every checkpoint_every, and the last step
    assert c.outputs.steps("eval") == [6, 12]  # each epoch's end
    assert loop.evaluations == 2


def test_a_resumed_run_starts_at_its_step_and_keeps_the_schedule():
    loop = ScriptedLoop(start=7)
    c = controller(loop, Schedule(total_steps=12, steps_per_epoch=6, steps_per_loop=10, log_every=4,
                                  checkpoint_every=10))
    c.run(7)
    assert loop.chunks == [(7, 8), (8, 10), (10, 12)]
    assert c.outputs.steps("train") == [8, 12]
    assert c.checkpoints.saved == [10, 12]


def test_a_run_resumed_at_its_end_evaluates_what_was_restored_once():
    loop = ScriptedLoop(start=6)
    c = controller(loop, Schedule(total_steps=6, steps_per_epoch=3))
    final = c.run(6)
    assert loop.chunks == [] and loop.evaluations == 1
    assert final["loss"] == pytest.approx(0.5)


def test_a_log_row_holds_the_window_since_the_last_row_and_names_the_throughput_by_what_is_counted():
    loop = ScriptedLoop(losses=lambda step: float(step))
    c = controller(loop, Schedule(total_steps=4, steps_per_epoch=4, log_every=2))
    c.run(0)
    rows = [r for split, _, r in c.outputs.rows if split == "train"]
    assert [r["loss"] for r in rows] == [pytest.approx(0.5), pytest.approx(2.5)]  # steps 0-1, then 2-3
    assert [r["examples"] for r in rows] == [2 * BATCH, 2 * BATCH]
    assert all("examples_per_second" in r and "images_per_second" not in r for r in rows)
    assert all(r["learning_rate"] == pytest.approx(0.1) for r in rows)


def test_the_throughput_leaves_out_the_first_chunk():
    loop = ScriptedLoop()
    c = controller(loop, Schedule(total_steps=1, steps_per_epoch=1))
    c.run(0)
    assert np.isnan(c.throughput)  # one chunk: all of it traced and compiled
    c2 = controller(ScriptedLoop(), Schedule(total_steps=3, steps_per_epoch=3))
    c2.run(0)
    assert c2.timed_steps == 2 and c2.throughput > 0


def test_a_loss_that_is_not_finite_stops_the_run_naming_the_last_good_checkpoint():
    loop = ScriptedLoop(losses=lambda step: float("nan") if step == 7 else 1.0)
    c = controller(loop, Schedule(total_steps=12, steps_per_epoch=12, checkpoint_every=5))
    with pytest.raises(TrainingDiverged, match=r"the loss is nan at step 8\. The last good checkpoint is kept: "
                                               r"/nowhere/checkpoints/ckpt-5"):
        c.run(0)
    assert c.checkpoints.saved == [5]  # nothing saved after the loss went bad


def test_a_stop_agreed_after_a_chunk_saves_that_step_and_ends_preempted():
    loop = ScriptedLoop(stop_after=3)
    c = controller(loop, Schedule(total_steps=12, steps_per_epoch=12, checkpoint_every=10), preemption=Asked())
    with pytest.raises(Preempted, match=r"Preempted at step 3 of 12: SIGTERM received by local\. Saved the "
                                        r"checkpoint of that step: /nowhere/checkpoints/ckpt-3"):
        c.run(0)
    assert c.checkpoints.saved == [3] and loop.chunks[-1] == (2, 3)


def test_an_epoch_end_that_says_stop_ends_the_run_at_that_epoch():
    loop = ScriptedLoop()
    seen = []

    class StopAtFour(Hook):
        def epoch_end(self, step, train, evaluated):
            seen.append((step, train["loss"], evaluated["loss"]))
            return step == 4

    c = controller(loop, Schedule(total_steps=10, steps_per_epoch=2), hooks=(StopAtFour(),))
    c.run(0)
    assert [s for s, _, _ in seen] == [2, 4]
    assert loop.position == 4
    assert seen[0][1] == pytest.approx(1.0) and seen[0][2] == pytest.approx(0.5)


def test_chunk_hooks_and_the_clock_see_every_chunk_in_order():
    loop = ScriptedLoop()
    calls, clock = [], []
    class Calls(Hook):
        def chunk_begin(self, step, end):
            calls.append(("begin", step, end))

        def chunk_end(self, step, end, window):
            calls.append(("end", step, end, window["examples"]))

        def eval_begin(self):
            calls.append(("eval",))

    c = controller(loop, Schedule(total_steps=4, steps_per_epoch=4, steps_per_loop=2, log_every=4, checkpoint_every=4),
                   hooks=(Calls(), Clock(clock)))
    c.run(0)
    assert calls == [("begin", 0, 2), ("end", 0, 2, 2 * BATCH), ("begin", 2, 4), ("end", 2, 4, 4 * BATCH),
                     ("eval",)]
    assert [step for step, *_ in clock] == [2, 4] and clock[0][1] <= clock[1][1] and clock[0][2] <= clock[1][2]


class SteadyClock:
    """``time.perf_counter`` for a controller whose loop moves it on by ``seconds`` a step (``TimedLoop``)."""

    def __init__(self):
        self.now = 0.0

    def perf_counter(self):
        return self.now

    @staticmethod
    def time():
        return 0.0


class TimedLoop(ScriptedLoop):
    """A scripted loop whose steps take ``seconds(step)`` on ``clock``."""

    def __init__(self, clock, seconds, **kwargs):
        super().__init__(**kwargs)
        self.clock, self.seconds = clock, seconds

    def train(self, num_steps, stop=lambda: False, chunk=None):
        self.clock.now += sum(self.seconds(s) for s in range(self.position, self.position + num_steps))
        return super().train(num_steps, stop, chunk)


def test_chunks_that_may_grow_double_up_to_the_time_bound_and_shrink_when_steps_slow_down(monkeypatch):
    import tfdist.engine.controller as module

    clock = SteadyClock()
    monkeypatch.setattr(module, "time", clock)
    # 10 ms a step (a quarter second holds 25), then 50 ms from step 100 on (5 steps).
    loop = TimedLoop(clock, lambda step: 0.01 if step < 100 else 0.05)
    c = controller(loop, Schedule(total_steps=160, steps_per_epoch=80, log_every=80, checkpoint_every=80, grow=True))
    c.run(0)
    sizes = [end - begin for begin, end in loop.chunks]
    # The first chunk compiles (not timed); a chunk's proposal sizes the chunk after next (the one after it is
    # agreed as it runs): 1, 1, then 2, 4, 8, 16 and 25 steps; an epoch's end cuts one short.
    assert sizes[:8] == [1, 1, 1, 2, 4, 8, 16, 25] and loop.chunks[8] == (58, 80), loop.chunks
    assert [end for _, end in loop.chunks if end % 80 == 0] == [80, 160]  # every epoch ends a chunk
    # The first chunk with slow steps is (80, 104); the second after it holds a quarter second of them.
    assert loop.chunks[10:12] == [(104, 128), (128, 143)], loop.chunks
    assert max(sizes[12:]) <= 5, loop.chunks
    fixed = TimedLoop(SteadyClock(), lambda step: 0.01)
    controller(fixed, Schedule(total_steps=40, steps_per_epoch=40, steps_per_loop=2, log_every=40,
                               checkpoint_every=40)).run(0)
    assert {end - begin for begin, end in fixed.chunks} == {2}  # grow=False: steps_per_loop as asked


def test_a_grown_chunk_is_a_multiple_of_steps_per_loop_and_a_small_share_of_the_progress_timeout():
    from tfdist.engine.chunks import CHUNK_SECONDS, ChunkSize, chunk_seconds

    size = ChunkSize(4, grow=True, seconds=1.0)
    for _ in range(10):
        size.measured(size.steps, size.steps * 0.011)  # 90 steps fit a second: 88 is the multiple of 4 below
        size.agreed(size.proposal)
    assert size.steps == 88
    size.measured(88, 88 * 1.0)  # a second a step: one loop of 4, not less
    assert size.proposal == 4 and size.steps == 88  # proposed; the next chunk is what was agreed
    size.agreed((88 + 4) // 2)  # two tasks' mean proposal: 46, and a chunk is a multiple of 4
    assert size.steps == 44
    fixed = ChunkSize(4, grow=False)
    fixed.measured(4, 0.001)
    fixed.agreed(64)
    assert fixed.steps == 4
    assert chunk_seconds(0) == CHUNK_SECONDS and chunk_seconds(2.0) == pytest.approx(0.1)
    assert chunk_seconds(1800.0) == CHUNK_SECONDS


def test_no_checkpoints_asked_for_saves_nothing_and_a_stop_says_so():
    loop = ScriptedLoop(stop_after=2)
    c = controller(loop, Schedule(total_steps=6, steps_per_epoch=6), checkpoints=False, preemption=Asked())
    with pytest.raises(Preempted, match="no checkpoint \\(none asked for\\)"):
        c.run(0)


def test_the_controller_imports_no_tensorflow():
    import tfdist.engine.controller as module
    import tfdist.engine.steps as steps_module

    for source in (module.__file__, steps_module.__file__):
        text = open(source).read()
        assert "\nimport tensorflow" not in text and "\nimport keras" not in text
