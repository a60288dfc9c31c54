"""The replayer's own pacing loop alone (no runtime or control process): how well it keeps its send schedule
on this machine, the floor under the `replayer.send_error_us` figure of a full replay.

    .venv/bin/python scripts/replayer_pacing.py [--log PATH] [--priority 70] [--cpu 0]

Publishes every observation of the log on a loopback PUB socket at the recorded times (what `edgeinfer replay`
does, through the same sim.replay.stream) and prints the send-timing error (us) as JSON.
"""
from __future__ import annotations

import argparse
import json

import zmq

from edgeinfer.core import clock, transport
from edgeinfer.sim.replay import stream
from edgeinfer.sim.run_config import ReplayConfig
from edgeinfer.sim.schedule import tick_grid
from edgeinfer.sim.session import load_log


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--log", default=None, help="any log sim.readers reads (default: the embedded synthetic log)")
    p.add_argument("--priority", type=int, default=ReplayConfig.replayer_priority, help="SCHED_FIFO, 0 = off")
    p.add_argument("--cpu", type=int, default=None, help="pin to this CPU")
    p.add_argument("--time-scale", type=float, default=1.0)
    args = p.parse_args()
    log = load_log(args.log)
    warning = clock.enter_realtime([args.cpu] if args.cpu is not None else None, args.priority)
    ctx = zmq.Context()
    try:
        ep = transport.Endpoints.free_loopback()
        pub = transport.pub(ctx, ep.obs, bind=True)
        cmd_rx = transport.Receiver(transport.pull(ctx, ep.commands, bind=True))
        chunk_rx = transport.Receiver(transport.sub(ctx, ep.chunks))
        rec = stream(log, tick_grid(log), 1, pub, cmd_rx, chunk_rx, 1.0, 200.0,
                      pacing=ReplayConfig(time_scale=args.time_scale))
    finally:
        ctx.destroy(linger=0)
        clock.leave_realtime()
    print(json.dumps({"log": log.name, "rows": len(log), "realtime": warning or f"SCHED_FIFO {args.priority}",
                      **{k: rec.pacing[k] for k in ("send_error_us", "rows_skipped", "late_sends")}}, indent=1))


if __name__ == "__main__":
    main()
