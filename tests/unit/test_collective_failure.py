"""``errors.collective_failure``: TensorFlow's error from a collective across workers as one line that names the
collective and the worker (TensorFlow's own text, as it reached Keras' fit, with the frames left out)."""

from __future__ import annotations

from tfdist.errors import CollectiveFailed, RunFailed, collective_failure

#: What Keras' fit raised on worker 0 when the padded gather of a sparse gradient changed its shape.
GATHER = """Graph execution error:

Detected at node allgather/CollectiveGatherV2_1 defined at (most recent call last):
  File "trainer.py", line 134, in one_step_on_data

Collective ops is aborted by: Shape mismatch in the collective instance 116. Op at device \
/job:worker/replica:0/task:0/device:CPU:0 expected shape [24,8] but another member in the group expected shape \
[192,8]. This is likely due to different input shapes at different members of the collective op.
The error could be from a previous operation. Restart your program to reset.
\t [[{{node allgather/CollectiveGatherV2_1}}]] [Op:__inference_multi_step_on_iterator_1286]
"""


def _tensorflow_error(name: str, text: str) -> Exception:
    kind = type(name, (Exception,), {"__module__": "tensorflow.python.framework.errors_impl"})
    return kind(text)


def test_a_collective_that_failed_is_one_line_naming_it_the_worker_and_the_cause():
    failed = collective_failure(_tensorflow_error("InvalidArgumentError", GATHER), "worker:1", 2, "Keras' fit")
    assert isinstance(failed, CollectiveFailed) and isinstance(failed, RunFailed) and failed.exit_code == 1
    line = str(failed)
    assert "\n" not in line and "Restart your program" not in line
    assert line.startswith("A collective failed in Keras' fit across 2 workers, on worker:0 (this is worker:1): "
                           "the all-gather allgather/CollectiveGatherV2_1 in multi_step_on_iterator: Shape mismatch "
                           "in the collective instance 116: the op on worker:0 expected shape [24,8] but another "
                           "member in the group expected shape [192,8]. Received: InvalidArgumentError"), line


def test_an_error_of_no_collective_or_not_from_tensorflow_is_left_as_it_is():
    assert collective_failure(_tensorflow_error("InvalidArgumentError", "Incompatible shapes: [2] vs [3]"),
                              "worker:0", 2, "training") is None
    assert collective_failure(ValueError("Collective in a message of another library"), "worker:0", 2, "x") is None
