"""The replayer only accepts commands a real control loop could have sent: for a tick that is already due."""
import numpy as np
import zmq

from edgeinfer.core import transport
from edgeinfer.core.clock import now_ns
from edgeinfer.core.wire import JointCommand
from edgeinfer.sim.received import Chunks, Commands
from edgeinfer.sim.replay import Recording, _collect


def test_commands_for_ticks_not_yet_due_or_out_of_range_are_rejected():
    ep = transport.Endpoints.free_loopback()
    ctx = zmq.Context()
    try:
        cmd_rx = transport.Receiver(transport.pull(ctx, ep.commands, bind=True))
        chunk_rx = transport.Receiver(transport.sub(ctx, ep.chunks))
        tx = transport.push(ctx, ep.commands)
        # a 1 s period: ticks 0..2 are due, tick 50 is 48 s in the future (a host stall cannot make it due)
        period = 1_000_000_000
        t0 = now_ns() - 2 * period
        rec = Recording(t0, period, 100, np.arange(100), t0 + np.arange(100) * period, np.zeros(100, dtype=np.int64),
                        Commands(100, 6), Chunks(100, 1, 6, 1))
        for seq in (0, 2, 50, -1, 100, 2):  # the second command for tick 2 is not the first: ignored
            transport.send(tx, JointCommand(seq, seq, -1, now_ns(), np.zeros(6), "hold"))
        tx.send_multipart([b"not msgpack"])
        deadline = now_ns() + 2_000_000_000
        while (rec.rejected_commands + rec.duplicate_commands + len(rec.commands) < 6 or rec.malformed < 1) \
                and now_ns() < deadline:
            cmd_rx.sock.poll(100)
            _collect(cmd_rx, chunk_rx, rec)
        assert sorted(rec.commands) == [0, 2]
        assert rec.rejected_commands == 3  # tick 50 not yet due; -1 and 100 outside the run
        assert rec.duplicate_commands == 1  # the second command for tick 2: counted, not used
        assert rec.malformed == 1
    finally:
        ctx.destroy(linger=0)
