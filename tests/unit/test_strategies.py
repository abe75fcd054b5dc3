"""The strategy registry refuses an unknown name and variable partitioning before any strategy is built."""

import pytest

from tfdist import strategies
from tfdist.errors import UserError


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(UserError, match=r"strategy='horovod'.*one_device, mirrored, multi_worker_mirrored"):
        strategies.make_strategy("horovod")


@pytest.mark.parametrize("ps_shards", [2, 8])
def test_variable_partitioning_is_refused_before_the_strategy_is_built(ps_shards):
    """Keras 3 variables cannot wrap a ShardedVariable: ps_shards > 1 is one line, before any device is set up."""
    with pytest.raises(UserError, match=rf"`--ps_shards`: variable partitioning does not work with Keras 3 .*"
                                        rf"Received: ps_shards={ps_shards}\. Expected 0 or 1") as info:
        strategies.make_strategy("parameter_server", ps_shards=ps_shards)  # no cluster needed: refused first
    assert "\n" not in str(info.value)
    strategies.check_ps_shards(0)
    strategies.check_ps_shards(1)

