"""Checkpoints under ``model_dir/checkpoints``: every worker saves, the chief alone into the run directory; an
evaluator reads each one the chief keeps."""

from __future__ import annotations

import shutil

import tensorflow as tf

from tfdist.errors import UserError
from tfdist.rundir import RunDir


def _reads_whole(path: str) -> bool:
    """Whether the checkpoint at ``path`` (its index and every tensor) can be read."""
    try:
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
    except (tf.errors.OpError, ValueError, IndexError):  # IndexError: "Read less bytes than requested"
        return False
    return True


class Checkpoints:
    """Save and restore a ``tf.train.Checkpoint`` for the chief and the workers.

    Args:
      checkpoint: the ``tf.train.Checkpoint`` (model, optimizer, step).
      run_dir: the run's directory.
      is_chief: whether this process writes the run's outputs.
      max_to_keep: checkpoints kept by the chief.
      task: this task, e.g. ``"worker:1"`` (names a worker's temporary directory).
      saves: False for a task that only reads the chief's checkpoints (an evaluator): it makes no directory.
    """

    def __init__(self, *, checkpoint: tf.train.Checkpoint, run_dir: RunDir, is_chief: bool, max_to_keep: int = 3,
                 task: str = "worker", saves: bool = True):
        # The stats summed since the last log row, and their seconds, saved with each step: a run resumed
        # between two rows (a preemption mid-epoch) writes its next row over the same steps as a straight run.
        # Added to the checkpoint after the restore, which fills it in if the checkpoint has one: a checkpoint
        # written without it still restores (``assert_existing_objects_matched`` would refuse it).
        self.window = tf.Variable(tf.zeros([0], tf.float64), shape=tf.TensorShape(None), trainable=False)
        self.checkpoint = checkpoint
        self.run_dir = run_dir
        self.directory = str(run_dir.checkpoints)
        self._scratch = None if is_chief or not saves else str(run_dir.scratch(task))
        self.manager = (tf.train.CheckpointManager(checkpoint, self._scratch or self.directory, max_to_keep=max_to_keep)
                        if saves else None)

    @classmethod
    def for_evaluation(cls, *, model, step, run_dir: RunDir) -> Checkpoints:
        """The chief's checkpoints read into ``model`` and the ``step`` counter, the parts of the run's layout
        (``engine.state.build_state``'s) that an evaluation needs: the optimizer's part is left unread."""
        return cls(checkpoint=tf.train.Checkpoint(model=model, step=step), run_dir=run_dir, is_chief=False,
                   saves=False)

    def kept(self) -> list[tuple[int, str]]:
        """``(step, path)`` of every checkpoint the chief keeps now (``CheckpointManager``'s list), oldest first."""
        state = tf.train.get_checkpoint_state(self.directory)
        paths = state.all_model_checkpoint_paths if state else []
        return sorted((int(path.rsplit("-", 1)[1]), path) for path in paths)

    def restore_for_evaluation(self, path: str) -> bool:
        """Restore the checkpoint at ``path`` into what this ``Checkpoints`` holds, leaving out what it does not
        (an evaluator's holds no optimizer); False when the chief removed it meanwhile (it keeps the last few)."""
        try:
            self.checkpoint.restore(path).expect_partial()
        except (tf.errors.NotFoundError, tf.errors.DataLossError):
            return False
        return True

    def latest(self) -> str | None:
        """The chief's latest checkpoint path, or None."""
        return tf.train.latest_checkpoint(self.directory)

    def restore_latest(self) -> str | None:
        """Restore the chief's latest checkpoint, if any; returns its path."""
        path = self.latest()
        if path:
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
            except (tf.errors.OpError, ValueError, AssertionError, IndexError) as e:  # IndexError: a cut data file
                raise self._unrestorable(path, e) from None
        self._add_window()
        return path

    def _unrestorable(self, path: str, error: Exception) -> UserError:
        """One line for a latest checkpoint that cannot be restored: a damaged file, or another model's variables.

        A damaged (e.g. truncated) file is named, with whether an older checkpoint of the run reads whole.
        """
        received = " ".join(str(error).split())[:160]
        if not _reads_whole(path):
            older = [p for p in tf.train.get_checkpoint_state(self.directory).all_model_checkpoint_paths if p != path]
            whole = [p for p in reversed(older) if _reads_whole(p)]
            then = (f"an older checkpoint, {whole[0]}, is whole: remove {path}.* and the line naming it in "
                    f"{self.directory}/checkpoint to resume from it" if whole else "no older checkpoint is whole")
            return UserError(f"Invalid model_dir {self.run_dir.path}: its latest checkpoint cannot be read, "
                             f"{path}.index or its data is damaged ({type(error).__name__}: {received}); {then}. "
                             "Expected a whole checkpoint, or a new model_dir.")
        return UserError(f"Invalid model_dir {self.run_dir.path}: its latest checkpoint {path} holds another model, "
                         f"optimizer or precision than this run's. Received: {type(error).__name__}: {received}. "
                         "Expected the same model, optimizer and precision to resume, or a new model_dir.")

    def _add_window(self) -> None:
        if getattr(self.checkpoint, "log_window", None) is not self.window:
            self.checkpoint.log_window = self.window

    def save(self, step: int, window=None) -> None:
        """Save at ``step`` (chief: into model_dir/checkpoints; others: into scratch), with the log ``window``."""
        self._add_window()
        if window is not None:
            self.window.assign(tf.constant(window, tf.float64))
        self.manager.save(checkpoint_number=step)

    def restored_window(self):
        """The log window saved with the restored step (empty: none, or a fresh start)."""
        return self.window.numpy()

    def close(self) -> None:
        """Remove a non-chief worker's scratch directory."""
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None
