"""A Heartbeat that decodes but announces a lease <= 0 (a corrupt message) is not a beat: taken in, it would expire
the lease at the next check, a peer declared lost that never was."""
from edgeinfer.core.liveliness import Lease
from edgeinfer.core.wire import Heartbeat

MS = 1_000_000


def hb(lease_ns: int) -> Heartbeat:
    return Heartbeat("control", 100, 1, 0, lease_ns, -1, -1, -1, -1)


def test_a_nonpositive_lease_is_not_taken_in():
    lease = Lease("control", 50 * MS)  # as the runtime watches the control loop: the announced lease, no ceiling
    assert lease.beat(hb(50 * MS), 1000 * MS) is None and lease.alive
    for bogus in (0, -(2**31) + 50 * MS):
        gap = lease.beat(hb(bogus), 1010 * MS)
        assert lease.check(1011 * MS) and lease.lease_ns == 50 * MS  # before: lost at once
        assert gap is None  # not a beat: no gap measured
    assert (lease.implausible, lease.lost, lease.joined) == (2, 0, 1)
    assert lease.beat(hb(50 * MS), 1020 * MS) == 20 * MS  # the gap from the last real beat
