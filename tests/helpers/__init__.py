"""One copy of each helper the test tiers share: paths and CLI runs, run outputs, cluster runs, tiny models,
scripts.

``tests/`` is on ``sys.path`` (pytest puts the root conftest's folder there), so tests import
``helpers.<module>``. Scripts started as processes (``stalled_input.py``, ``keras_fit_worker.py``,
``local_slurm.sh``) live here too and are found through ``helpers.clis.HELPERS``.
"""
