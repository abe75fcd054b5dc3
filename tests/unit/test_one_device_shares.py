"""``one_device.shares``: a replica's share of the step is one record in its thread's slot, put in place by
``loss_share`` or ``replica_share`` and the one before it back after. No TensorFlow here: plain numbers stand in
for the counts."""

from __future__ import annotations

import threading

from tfdist.one_device import shares


def test_a_share_is_one_record_put_in_place_and_the_one_before_back_after():
    assert shares.current() == shares.Share()  # outside a step: an empty record
    with shares.loss_share(0.25):
        assert shares.current() == shares.Share(weight=0.25)
        with shares.replica_share(3, 8):
            held = shares.current()
            assert (held.examples, held.total, held.weight, held.scaled) == (3, 8, 0.25, False)
            held.scaled = True  # as Keras' scaling of this step's loss marks it
        assert shares.current() == shares.Share(weight=0.25)
    assert shares.current() == shares.Share()


def test_a_replica_share_starts_unscaled_and_each_thread_holds_its_own():
    seen = {}

    def replica(examples):
        with shares.replica_share(examples, 8):
            seen[examples] = (shares.current().examples, shares.current().scaled)

    with shares.replica_share(5, 8):
        shares.current().scaled = True
        threads = [threading.Thread(target=replica, args=(n,)) for n in (3, 5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        with shares.replica_share(5, 8):
            assert shares.current().scaled is False
        assert shares.current().scaled is True
    assert seen == {3: (3, False), 5: (5, False)}
    assert shares.current() == shares.Share()
