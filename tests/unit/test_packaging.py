"""The wheel ships the named experiments: ``--config quick`` from a wheel installed elsewhere.

``configs/experiments/`` is the one copy of the YAML files; setup.py maps it to the
package ``tfdist.experiments``, so a wheel holds it as ``tfdist/experiments/*.yaml``.
"""

import pytest

from tfdist import config as config_lib
from tfdist.errors import UserError
from helpers.clis import REPO

EXPERIMENTS = REPO / "configs" / "experiments"
NAMES = sorted(p.stem for p in EXPERIMENTS.glob("*.yaml"))


def test_named_experiment_resolves_and_the_error_lists_the_names():
    assert NAMES, "configs/experiments/ must hold at least one experiment"
    found = config_lib.resolve_experiment_path("quick")
    assert found.is_file() and found.read_text() == (EXPERIMENTS / "quick.yaml").read_text()
    with pytest.raises(UserError, match=r"one of: (.*)\.$") as error:
        config_lib.resolve_experiment_path("no_such_experiment")
    assert f"one of: {', '.join(NAMES)}." in str(error.value)  # not "(none)"


