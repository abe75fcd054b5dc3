"""A renamed flag keeps its old name working (``cli.rename_flags``), with one ``note:`` line once the command is done."""

from __future__ import annotations

from helpers.clis import REPO, run_cli
from tfdist.cli import rename_flags

RENAMED = {"export": "export_tf_config", "image": "input_image"}


def test_old_names_are_spelled_as_the_new_ones_up_to_the_double_dash():
    argv = ["prog", "--export", "-image=x.png", "--noexport", "--image", "y.png", "--images=1", "--", "--image=z"]
    renamed, given = rename_flags(argv, RENAMED)
    assert renamed == ["prog", "--export_tf_config", "-input_image=x.png", "--noexport_tf_config", "--input_image",
                       "y.png", "--images=1", "--", "--image=z"]
    assert given == ["export", "image", "export", "image"]
    assert rename_flags(["prog", "--cluster=c.yaml"], RENAMED) == (["prog", "--cluster=c.yaml"], [])


def test_tfconfigs_old_export_flag_works_and_ends_with_one_note():
    cluster = REPO / "configs" / "clusters" / "local_mwm.yaml"
    old, new = (run_cli("tfdist.tfconfig", f"--cluster={cluster}", "--task=worker:1", flag, timeout=60)
                for flag in ("--export", "--export_tf_config"))
    assert old.returncode == new.returncode == 0, old.stderr + new.stderr
    assert old.stdout == new.stdout and old.stdout.startswith("export TF_CONFIG='")
    assert new.stderr == ""
    assert old.stderr.splitlines() == ["note: --export is deprecated; use --export_tf_config (the same flag, renamed)"]


def test_tfconfigs_old_emit_runs_tfdist_manifest_and_ends_with_one_note():
    args = ("--cluster", str(REPO / "configs" / "clusters" / "local_ps.yaml"), "--image", "img", "--", "--epochs", "3")
    new = run_cli("tfdist.manifest", "--form", "tfjob", *args, timeout=60)
    old = run_cli("tfdist.tfconfig", "--emit=tfjob", *args, timeout=60)
    assert new.returncode == old.returncode == 0, (new.stderr, old.stderr)
    assert old.stdout == new.stdout and "kind: TFJob" in new.stdout
    assert new.stderr == ""
    assert old.stderr.splitlines() == [
        "note: tfdist.tfconfig --emit is deprecated; use python -m tfdist.manifest --form (the same manifests)"]
    # A user error stays the only line.
    refused = run_cli("tfdist.tfconfig", "--emit", "tfjob", *args[:2], timeout=60)
    assert refused.returncode == 2 and refused.stderr.splitlines() == [
        "error: Missing `--image` for --form=tfjob. Received: image=None. Expected the container image to run, with "
        "tfdist installed, e.g. --image registry.example.com/tfdist:0.1.0."]
