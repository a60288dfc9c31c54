"""How the replayer paces its sends, and how well it kept its own schedule.

Row i of a log is due at t0 + tick_i * period / time_scale on the replayer's monotonic clock (an absolute
schedule: a late send never shifts later ones). After a stall, rows whose successor is already due are
skipped (counted), so the stream resumes on schedule instead of bursting, unless catch_up is set. With
as_fast_as_possible there is no schedule: each row goes out as soon as the previous one has, and its send
time is its due time.

The replayer's own timing error is actual send - scheduled send, per row sent on a schedule; a replay whose
error is large measures the harness, not the system under test.
"""
from __future__ import annotations

import numpy as np

from edgeinfer.sim.schedule import gap_report
from edgeinfer.sim.stats import latency_summary_ms

# A send later than this fraction of a period counts as late (the tick's observation arrived noticeably off).
LATE_FRACTION = 0.1


def scaled_period_ns(period_ns: int, time_scale: float) -> int:
    """The replay period in ns: the log's period divided by time_scale (2.0 replays twice as fast)."""
    return max(1, int(round(period_ns / time_scale)))


def should_skip(i: int, now_ns: int, t_sched_ns: np.ndarray, catch_up: bool) -> bool:
    """True when row i is stale at now_ns: the next row is already due, so sending i would start a burst."""
    return not catch_up and i + 1 < len(t_sched_ns) and now_ns >= t_sched_ns[i + 1]


def send_timing_report(t_sched_ns: np.ndarray, t_sent_ns: np.ndarray, skipped: np.ndarray, period_ns: int,
                       time_scale: float, as_fast_as_possible: bool, catch_up: bool) -> dict:
    """The replayer's send timing: error = t_sent - t_sched in us (p50, p90, p99, p999, max, mean) over the rows
    sent on a schedule; rows skipped after a stall; rows sent later than LATE_FRACTION of a period.

    t_sched_ns, t_sent_ns: (N,) int64 ns (t_sent 0 = never reached: an interrupted run); skipped: (N,) bool.
    With as_fast_as_possible the error is None (no schedule to miss).
    """
    reached = t_sent_ns != 0
    sent = reached & ~skipped
    err_ns = t_sent_ns[sent] - t_sched_ns[sent]
    summary = None
    if not as_fast_as_possible and err_ns.size:
        summary = {k: v * 1e3 for k, v in latency_summary_ms(err_ns).items()} | {"n": int(err_ns.size)}
    late_ns = LATE_FRACTION * period_ns
    return {"time_scale": time_scale, "as_fast_as_possible": as_fast_as_possible, "catch_up": catch_up,
            "period_ns": int(period_ns), "send_error_us": summary,
            "rows_sent": int(sent.sum()), "rows_skipped": int((skipped & reached).sum()),
            "late_sends": 0 if as_fast_as_possible else int(np.sum((t_sent_ns[sent] - t_sched_ns[sent]) > late_ns)),
            "late_threshold_us": late_ns / 1e3}


def delivery_report(rec) -> dict:
    """The report's "observations": every observation the replayer sent (pre-roll and rows; rec.obs_sent), those
    its full queue refused (obs_refused: counted, never silent), and per node what arrived (`delivered`: the
    "observations" counter of its last Stats, superseded ones included; None: no Stats came) and what did not
    (`dropped` = sent - delivered; network faults injected on purpose count there too)."""
    delivered = {name: (st.counters.get("observations") if (st := rec.node_stats.get(name)) else None)
                 for name in ("control", "runtime")}
    return {"sent": rec.obs_sent, "refused_full_queue": rec.obs_refused, "delivered": delivered,
            "dropped": {name: None if n is None else rec.obs_sent - n for name, n in delivered.items()}}


def replayer_section(rec, log) -> dict:
    """The report's "replayer" entry: send timing (send_timing_report), the faults injected (None when off),
    and what the reader did with the log (format, records sorted back into order, velocities or positions
    derived, gaps: schedule.gap_report; records skipped or filled for bad joint cells; extra channels and the
    records dropped before their first sample)."""
    return {**rec.pacing, "faults": rec.faults,
            "log_source": {"format": log.source, "reordered_records": log.reordered,
                           "qd_from_differences": log.qd_from_differences, "q_from_integration": log.q_from_integration,
                           "truncated_at": log.truncated_at_row, "gaps": gap_report(rec.tick, log.period_ns),
                           "rows_skipped": log.rows_skipped, "rows_filled": log.rows_filled,  # reader's bad_rows
                           # a log with extra channels: their widths, the records before one's first sample
                           **({"extra_channels": {k: v.shape[1] for k, v in log.extra.items()},
                               "dropped_before_extra": log.dropped_before_extra} if log.extra else {})}}
