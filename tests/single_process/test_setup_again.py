"""``tfdist.setup`` called again in one process: the same arguments give the same strategy, other ones one line
that names each argument that differs, as the call typed it, with the value the process was set up with."""

from __future__ import annotations

from helpers.outputs import tagged

AGAIN = """
import json
import tfdist
first = tfdist.setup("one_device", verbose=False)
out = {"same": tfdist.setup("one_device") is first,
       "auto": tfdist.setup("auto") is first,               # 'auto' is one_device here: the same set-up
       "verbose": tfdist.setup("one_device", verbose=True) is first}
for name, kwargs in {"connect_timeout": dict(strategy="one_device", connect_timeout=5.0),
                     "auto_other": dict(strategy="auto", cpu_devices=2),
                     "mirrored": dict(strategy="mirrored")}.items():
    try:
        tfdist.setup(**kwargs)
        out[name] = None
    except tfdist.errors.UserError as e:
        out[name] = str(e)
print("RESULTS " + json.dumps(out))
"""

HEAD = "Invalid second tfdist.setup: this process is already set up for strategy='one_device'. Received: "


def test_setup_again_returns_the_same_strategy_or_names_what_differs(python):
    result = python(AGAIN, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    out = tagged(result.stdout, "RESULTS")
    assert out["same"] and out["auto"] and out["verbose"], out
    assert out["connect_timeout"].startswith(HEAD + "connect_timeout=5.0 (set up with 120.0). Expected one set-up "
                                             "per process"), out["connect_timeout"]
    assert out["auto_other"].startswith(HEAD + "strategy='auto', which is 'mirrored' here (set up with "
                                        "'one_device'), cpu_devices=2 (set up with 0). Expected"), out["auto_other"]
    assert out["mirrored"].startswith(HEAD + "strategy='mirrored' (set up with 'one_device'). Expected"), out
