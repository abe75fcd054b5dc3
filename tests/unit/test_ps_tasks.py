"""``--ps_shards`` above one is one line, before TensorFlow starts; 0 or 1 (whole variables, as always) is taken."""

import yaml

from helpers.clis import assert_user_error, run_cli


def test_ps_shards_above_one_is_one_line_before_tensorflow_starts(tmp_path):
    """docs/running.md: `--ps_shards 2` ends with status 2 and one line, before TensorFlow starts.

    --model_dir stays untouched."""
    spec = tmp_path / "cluster.yaml"  # 2 ps tasks, nothing listening: the refusal comes before any connection
    spec.write_text(yaml.safe_dump({"chief": "127.0.0.1:1", "worker": ["127.0.0.1:2"],
                                    "ps": ["127.0.0.1:3", "127.0.0.1:4"]}))
    model_dir = tmp_path / "run"
    proc = run_cli("tfdist.train", "--strategy", "parameter_server", "--ps_shards", "2", "--cluster", str(spec),
                   "--task", "chief:0", "--connect_timeout", "5", "--model_dir", str(model_dir), timeout=60)
    line = assert_user_error(proc, r"^error: Invalid value for `--ps_shards`: variable partitioning does not work "
                                   r"with Keras 3 .*Received: ps_shards=2\. Expected 0 or 1")
    assert "ShardedVariable" in line
    assert not model_dir.exists()



def test_a_deployments_command_takes_the_retired_ps_flags_and_refuses_partitioning():
    """``tfdist.manifest ... -- --ps_shards 1`` is a command every task runs; ``-- --ps_shards 2`` is one line here."""
    import pytest

    from tfdist.errors import UserError
    from tfdist.segmentation.command import check_command

    where = "tfdist.manifest --form kubernetes"
    check_command(["--ps_shards", "1", "--ps_min_shard_bytes=1024"], strategy="parameter_server", where=where)
    with pytest.raises(UserError, match=r"^Invalid value for `--ps_shards`: variable partitioning .*ps_shards=2\."):
        check_command(["--ps_shards=2"], strategy="parameter_server", where=where)
