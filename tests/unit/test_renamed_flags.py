"""A renamed flag keeps its old name working (``errors.rename_flags``), with one ``note:`` line once the command is done."""

from __future__ import annotations

import subprocess
import sys

from helpers.clis import REPO
from tfdist.errors import rename_flags

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
    old, new = ([sys.executable, "-m", "tfdist.tfconfig", f"--cluster={cluster}", "--task=worker:1", flag]
                for flag in ("--export", "--export_tf_config"))
    old, new = (subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO) for cmd in (old, new))
    assert old.returncode == new.returncode == 0, old.stderr + new.stderr
    assert old.stdout == new.stdout and old.stdout.startswith("export TF_CONFIG='")
    assert new.stderr == ""
    assert old.stderr.splitlines() == ["note: --export is deprecated; use --export_tf_config (the same flag, renamed)"]
