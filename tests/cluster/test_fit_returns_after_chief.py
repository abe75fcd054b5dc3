"""``tfdist.fit`` on two workers returns on every worker only once the chief's last file of that fit is written."""

from __future__ import annotations

import sys

import pytest

from helpers.cluster_runs import Processes, launcher, loopback_cluster
from helpers.models import source

pytestmark = pytest.mark.slow

#: A script whose chief callback sleeps in on_train_end, then writes final.txt; every worker says whether it
#: sees that file as soon as tfdist.fit returns.
SCRIPT = source() + """
import json, os, sys, time
import tfdist
strategy = tfdist.setup("multi_worker_mirrored")
import numpy as np, keras
out = sys.argv[1]

class SlowChiefEnd(keras.callbacks.Callback):  # runs on every worker; the chief alone writes, late
    def on_train_end(self, logs=None):
        if json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0:
            time.sleep(5)
            with open(os.path.join(out, "final.txt"), "w") as f:
                f.write("written")

def model_fn():
    return dense(4, 2, loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))

x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
tfdist.fit(model_fn, x, (x[:, 0] > 0).astype("int64"), batch_size=16, epochs=1, callbacks=[SlowChiefEnd()],
           verbose=0)
print("FINAL_SEEN", os.path.exists(os.path.join(out, "final.txt")), flush=True)
"""


def test_every_worker_sees_the_chiefs_last_file_when_tfdist_fit_returns(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    cluster = loopback_cluster(tmp_path / "cluster.yaml", worker=2)
    with Processes(tmp_path) as procs:
        proc = procs.start("launch", launcher(cluster, sys.executable, str(script), str(tmp_path)))
        status, text = proc.wait(300), proc.text()
    assert status == 0, text[-3000:]
    for task in ("worker:0", "worker:1"):
        assert f"[{task}] FINAL_SEEN True" in text, text[-3000:]
