"""Hardware in the loop: replay a log on this machine (the robot side: replayer and control loop) against a
runtime node on another machine, and separate the network from the inference.

    this host (robot side)                                    runtime host (HOST)
    replayer --Observation  PUB  bind ROBOT:PORT+2  ------->  SUB   edgeinfer serve
    replayer <-- ready      PULL bind ROBOT:PORT+3  <-------  PUSH
    control  --Heartbeat... PUB  bind ROBOT:PORT+4  ------->  SUB
    control, replayer <-- ActionChunk  SUB  ------- HOST:PORT    PUB bind
    prober   <-> echo     DEALER  ----------------- HOST:PORT+1  ROUTER bind (node/echo.py)
    control  --JointCommand PUSH -> replayer PULL on 127.0.0.1:PORT+5 (never leaves this host)

`--endpoint tcp://HOST:PORT` names the runtime's chunk publisher; the run uses the block PORT..PORT+5 (PORT_MAP).
ROBOT (bind_host) is this host's address that routes to HOST unless given. `hil_serve_command` prints the
matching `edgeinfer serve` line for the runtime host. A runtime node serves one run (it exits on the Stop).

Clocks: every figure is measured on this host's monotonic clock. Observation sent -> command received (the
first command planned from that observation) and observation sent -> chunk received are both timestamped here;
the runtime's own timestamps (ActionChunk.t_ready_ns, its latency histograms) are from another clock and are
left out. The bare network round trip (sim/roundtrip.py) is timed before the replay (rtt_before probes) and
during it (one every rtt_period_ms, from a child process), and the latency figures are also given minus its
median, so the report separates network from inference.
"""
from __future__ import annotations

import dataclasses
import select
import socket
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np
import zmq
from rich.console import Console
from rich.markup import escape

from edgeinfer.core import transport
from edgeinfer.core.telemetry import stats_summary
from edgeinfer.engines.models.paths import DEFAULT_POLICY
from edgeinfer.node.runtime import RuntimeConfig
from edgeinfer.procs.node_spec import NodeSpec
from edgeinfer.procs.peers import Peer, spawn_peer
from edgeinfer.sim import roundtrip
from edgeinfer.sim.host import sched_state
from edgeinfer.sim.metrics import CONFIDENCE, measured_chunks, row_of_tick, summarize
from edgeinfer.sim.plots import PLOT_FILES, plot_histogram, plot_stages, plot_timeline
from edgeinfer.sim.received import HOLD, NONE
from edgeinfer.sim.replay import drain, replay_rows
from edgeinfer.sim.report import replay_progress
from edgeinfer.sim.run_config import ReplayConfig, SessionConfig
from edgeinfer.sim.session import RobotSockets, RunSession, prepare, robot_sections, write_outputs
from edgeinfer.sim.stats import latency_ci_ms, latency_summary_ms
from edgeinfer.sim.supervisor import Supervisor

PORT_MAP = {"chunks": 0, "echo": 1, "obs": 2, "ready": 3, "status": 4, "commands": 5}  # offsets from PORT
# the runtime's histograms that subtract our timestamps from its clock: meaningless across hosts
CROSS_CLOCK_HISTOGRAMS = ("obs_age_at_runtime", "time_to_chunk", "time_to_first_action")
HIL_STAGES = {
    "send": "observation due -> sent by the replayer",
    "obs->chunk": "observation sent -> its chunk received (network both ways + runtime)",
    "control": "tick due -> command sent by the control loop",
    "command": "command sent -> command received by the replayer",
}
BEFORE_GAP_MS = 2.0  # spacing of the probes before the replay


@dataclass(kw_only=True)
class HilConfig(SessionConfig):
    """Hardware in the loop: the robot side's settings (SessionConfig, passed on to a ReplayConfig), the remote
    runtime's endpoint, and the round-trip probes that separate the network from the inference."""

    # tcp://HOST:PORT of the remote runtime's chunk publisher (the run uses the port block PORT_MAP).
    endpoint: str = dataclasses.field(kw_only=False)
    out: Path = Path("out/hil")  # output folder: report.json, ticks.csv, plots, control.log
    # Manifest of the policy the remote runtime serves (its joint count and chunk step; not loaded here).
    policy: Path = DEFAULT_POLICY
    # Address of this host the robot-side sockets bind and the runtime connects to (None: the one that routes
    # to HOST).
    bind_host: str | None = None
    curve: Literal["auto", "on", "off"] = "auto"  # CURVE encryption, as transport.Endpoints
    # Folder of the CURVE keys (from `edgeinfer keys DIR`, the same DIR on both hosts).
    curve_dir: Path | None = None
    rtt_before: int = 200  # round trips timed before the replay
    rtt_period_ms: float = 20.0  # one round trip every this long during the replay, ms
    rtt_timeout_ms: float = 1000.0  # a probe unanswered this long is lost, ms

    def __post_init__(self):
        super().__post_init__()
        self.policy = Path(self.policy)
        self.curve_dir = Path(self.curve_dir) if self.curve_dir is not None else None
        parse_endpoint(self.endpoint)
        if not 10 <= self.rtt_before <= 100_000:
            raise ValueError(f"HilConfig.rtt_before must be in 10..100000, got {self.rtt_before}")
        if not 1 <= self.rtt_period_ms <= 10_000:
            raise ValueError(f"HilConfig.rtt_period_ms must be in [1, 10000], got {self.rtt_period_ms}")
        if not 0 < self.rtt_timeout_ms <= 60_000:
            raise ValueError(f"HilConfig.rtt_timeout_ms must be in (0, 60000], got {self.rtt_timeout_ms}")

    def replay_config(self) -> ReplayConfig:
        """The ReplayConfig of the fields the two share (reader, pacing, deadline, SLO, control, faults); the
        runtime section names only the policy; no fault drill on the remote process, no CPU pinning."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(SessionConfig)}
        return ReplayConfig(**values, runtime=RuntimeConfig(policy=self.policy), pin_cpus=False)


def parse_endpoint(endpoint: str) -> tuple[str, int]:
    """(HOST, PORT) of tcp://HOST:PORT; ValueError naming the endpoint when it is not one, or PORT+5 > 65535."""
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    if not endpoint.startswith("tcp://") or not host or not port.isdigit():
        raise ValueError(f"HilConfig.endpoint must be tcp://HOST:PORT, got {endpoint!r}")
    if not 1 <= int(port) <= 65535 - max(PORT_MAP.values()):
        raise ValueError(f"HilConfig.endpoint: PORT must be in 1..{65535 - max(PORT_MAP.values())} (the run uses "
                         f"PORT..PORT+{max(PORT_MAP.values())}), got {port}")
    return host.strip("[]"), int(port)


def route_address(host: str) -> str:
    """This host's address on the interface that routes to `host` (a UDP connect sends nothing). Raises
    ValueError when `host` does not resolve."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((socket.gethostbyname(host), 9))
            return s.getsockname()[0]
    except OSError as e:
        raise ValueError(f"HilConfig.endpoint: cannot route to {host!r} ({e})") from None


def hil_endpoints(cfg: HilConfig) -> tuple[transport.Endpoints, str, str]:
    """(the robot side's Endpoints, the echo endpoint, ROBOT) for cfg.endpoint, per PORT_MAP."""
    host, port = parse_endpoint(cfg.endpoint)
    robot = cfg.bind_host or route_address(host)
    at = lambda h, name: f"tcp://{h}:{port + PORT_MAP[name]}"  # noqa: E731
    ep = transport.Endpoints(obs=at(robot, "obs"), chunks=at(host, "chunks"), commands=at("127.0.0.1", "commands"),
                             ready=at(robot, "ready"), status=at(robot, "status"), curve=cfg.curve,
                             curve_dir=cfg.curve_dir)
    return ep, at(host, "echo"), robot


def hil_serve_command(cfg: HilConfig, robot: str, bind: str = "0.0.0.0") -> str:
    """The `edgeinfer serve` command line for the runtime host: binds the chunk PUB and the echo on `bind`,
    connects to ROBOT's observation, ready and status endpoints. --max-obs-age-ms is set far out of reach:
    the two hosts' monotonic clocks are unrelated, so an observation's age cannot be read there."""
    _, port = parse_endpoint(cfg.endpoint)
    at = lambda h, name: f"tcp://{h}:{port + PORT_MAP[name]}"  # noqa: E731
    # what this side decided (transport.Endpoints.curve_keys), spelt out: the runtime binds 0.0.0.0, where "auto"
    # could decide otherwise, and the two sides must agree
    curve = f" --curve on --curve-dir {cfg.curve_dir}" if _speaks_curve(cfg) else " --curve off"
    return (f"edgeinfer serve --chunks {at(bind, 'chunks')} --echo-endpoint {at(bind, 'echo')} "
            f"--obs {at(robot, 'obs')} --ready {at(robot, 'ready')} --status {at(robot, 'status')} "
            f"--commands {at(robot, 'commands')} --max-obs-age-ms 1e12{curve}")


def _speaks_curve(cfg: HilConfig) -> bool:
    """Whether this side's sockets use CURVE (Endpoints.curve_keys: keys given, or an endpoint off loopback)."""
    return cfg.curve != "off" and (cfg.curve == "on" or cfg.curve_dir is not None
                                   or not transport.is_loopback(cfg.endpoint))


def hil(cfg: HilConfig, console: Console | None = None) -> dict:
    """Run one hardware-in-the-loop replay against the runtime at cfg.endpoint (started separately, see
    hil_serve_command); writes report.json (with "network" and "hil" sections), ticks.csv, the three plots,
    run.mcap (sim/run_mcap.py) and control.log under cfg.out. Returns the report.

    Raises LogError for a log the policy cannot run on, ValueError for a bad endpoint or missing CURVE keys,
    TimeoutError when the runtime does not complete the handshake within handshake_timeout_s, RuntimeError when
    the local control process dies during start-up or the runtime never answers a round-trip probe.
    """
    console = console or Console()
    rcfg = cfg.replay_config()
    prep = prepare(rcfg, console)
    ep, echo, robot = hil_endpoints(cfg)
    keys = ep.curve_keys()
    cfg.out.mkdir(parents=True, exist_ok=True)
    console.print(f"hil: on the runtime host run: [bold]{escape(hil_serve_command(cfg, robot))}[/bold]\n"
                  f"hil: waiting up to {cfg.handshake_timeout_s:g} s for it (--handshake-timeout-s)")
    with RunSession() as run:
        # before the control node starts: it neither inherits the baseline's priority nor loads it
        run.measure_host(prep.period_ns, cfg.host_baseline_s, cfg.control.control_cpus, cfg.replayer_priority)
        (control,) = run.start(*hil_nodes(cfg, ep))
        prober = _start_prober(run, echo, cfg, cfg.out / "rtt_during.npy")
        run.realtime(cfg.control.control_cpus, cfg.replayer_priority)  # the runtime's host is not this one
        run.authenticate(keys)
        socks = _bind(run.ctx, ep, prep.log.n_joints, keys, cfg.endpoint)
        run.defer(socks.abort, "hil failed on the robot side")
        with console.status(f"waiting for the runtime at {cfg.endpoint} and the local control loop"):
            socks.handshake(cfg.handshake_timeout_s, lambda: run.group.check_started([control]))
        run.sched["control"] = sched_state(control.pid, cfg.control.realtime_priority)  # asked for when it opened
        before = _round_trips_before(run.ctx, echo, keys, cfg, console)
        _go(prober)
        with replay_progress(console, len(prep.log), f"replaying at {prep.log.rate_hz:.0f} Hz against "
                                                     f"{cfg.endpoint}") as bar:
            sup = Supervisor(socks.obs_pub, [], None, None, lambda: None, 0, socks.status_rx)  # Heartbeats; status read
            rec = replay_rows(prep, socks, rcfg, sup.on_row, bar)
        run.signals.ignore()  # a second Ctrl-C must not lose the report of the first
        socks.stop(rec.interrupted)
        during = _stop_prober(prober, cfg.out / "rtt_during.npy", cfg.rtt_timeout_ms / 1000)
        exit_code = run.group.finish([control])["control"]
        drain(socks.cmd_rx, socks.chunk_rx, rec, socks.status_rx, limit=10_000)
    report, per_tick = summarize(rec, prep.log, rcfg, prep.deadline_ms, prep.stride)
    report.update(decode="remote", engine=f"runtime at {cfg.endpoint}", drafter=None, budget_ms=None, k_max=None,
                  process_exit_codes={"control": exit_code}, runtime_fault=None)
    stages = _hil_sections(report, rec, per_tick, cfg, ep, echo, robot, network_section(before, during, echo))
    node_stats = {name: _same_clock_stats(stats_summary(st)) for name, st in sorted(rec.node_stats.items())}
    robot_sections(report, rec, prep, run, node_stats, console, cfg.out)
    write_outputs(report, per_tick, rec, prep.log, cfg, console, partial(_plots, stages=stages), stages,
                  title="edgeinfer hil")
    _say_network(report["network"], console)
    return report


def _bind(ctx: zmq.Context, ep: transport.Endpoints, n_joints: int, keys, endpoint: str) -> RobotSockets:
    """The robot side's sockets (session.RobotSockets, CURVE with `keys`); OSError naming the port block when a
    bind fails."""
    try:
        return RobotSockets.open(ctx, ep, n_joints, keys)
    except zmq.ZMQError as e:
        raise OSError(f"cannot bind the robot side's sockets ({e}): another run on ports PORT+2..PORT+5 of "
                      f"{endpoint}?") from None


def _round_trips_before(ctx: zmq.Context, echo: str, keys, cfg: HilConfig, console: Console) -> np.ndarray:
    """cfg.rtt_before round trips to the runtime's `echo`, BEFORE_GAP_MS apart, after a warm-up: (k, 2) int64
    (t_sent_ns, round_trip_ns or -1). Raises RuntimeError when the warm-up gets no answer."""
    timeout_ns = int(cfg.rtt_timeout_ms * 1e6)
    with console.status(f"timing {cfg.rtt_before} network round trips to {echo}"):
        probe = roundtrip.connect(ctx, echo, keys)
        if not roundtrip.warm_up(probe, timeout_ns):
            raise RuntimeError(f"no echo from {echo} within {cfg.rtt_timeout_ms} ms: start the runtime with "
                               f"--echo-endpoint (see the serve command above)")
        before = roundtrip.round_trips(probe, cfg.rtt_before, int(BEFORE_GAP_MS * 1e6), timeout_ns)
        probe.close(linger=0)
    return before


def _hil_sections(report: dict, rec, per_tick: dict, cfg: HilConfig, ep: transport.Endpoints, echo: str,
                  robot: str, network: dict) -> dict[str, np.ndarray]:
    """Put the "network", "stages_ms" (this host's clock only) and "hil" sections in `report`; the stages
    (hil_stages), for the plots and run.mcap."""
    report["network"] = network
    stages = hil_stages(rec, per_tick)
    report["stages_ms"] = {k: latency_summary_ms(v * 1e6) for k, v in stages.items()}
    report["hil"] = hil_section(rec, cfg, ep, echo, robot, network["round_trip_ms"]["p50"])
    return stages


def hil_nodes(cfg: HilConfig, ep: transport.Endpoints) -> list[NodeSpec]:
    """The nodes a hil run starts here: the control loop (the runtime runs on its own host: hil_serve_command)."""
    return [NodeSpec("control", (cfg.control, ep), "control", cfg.out / "control.log")]


def _start_prober(run: RunSession, echo: str, cfg: HilConfig, out: Path) -> Peer:
    """The round-trip prober (sim/roundtrip.py) to `echo`, writing its samples to `out`, started through procs
    (procs/peers.py: a session of its own, the parent-pid watch); torn down at the run's teardown if it still
    runs then."""
    args = [echo, str(cfg.rtt_period_ms), str(cfg.rtt_timeout_ms), str(out),
            *([str(cfg.curve_dir)] if _speaks_curve(cfg) else [])]
    prober = spawn_peer("edgeinfer.sim.roundtrip", args, name="round-trip prober", stdin=True)
    run.defer(prober.close)  # a no-op once it has exited
    return prober


def _go(prober: Peer, timeout_s: float = 30.0) -> None:
    """Start the prober's interleaved probes once it has connected and warmed up."""
    ready = select.select([prober.stdout], [], [], timeout_s)[0] and prober.stdout.readline().strip() == "ready"
    if not ready:
        raise RuntimeError(f"round-trip prober not ready within {timeout_s} s (exit code {prober.poll()})")
    prober.stdin.write("go\n")
    prober.stdin.flush()


def _stop_prober(prober: Peer, out: Path, timeout_s: float) -> np.ndarray:
    """Stop the interleaved probes (after the one in flight, up to timeout_s); their (k, 2) samples (none when
    the prober failed)."""
    try:
        prober.stdin.write("stop\n")
        prober.stdin.close()
    except BrokenPipeError:  # it has exited already
        pass
    prober.finish(timeout_s=5 + timeout_s, term_s=0.1)
    return np.load(out, allow_pickle=False) if out.exists() else np.zeros((0, 2), dtype=np.int64)


def _say_network(network: dict, console: Console) -> None:
    net = network["round_trip_ms"]
    console.print(f"network round trip p50 {net['p50']:.3f} ms, p99 {net['p99']:.3f} ms, max {net['max']:.3f} ms "
                  f"(n={network['n']}, lost {network['lost']})")


def _summary(rtt_ns: np.ndarray) -> dict:
    ok = rtt_ns[rtt_ns >= 0]
    return {"n": int(ok.size), "lost": int(rtt_ns.size - ok.size), "round_trip_ms": latency_summary_ms(ok),
            "round_trip_ci95_ms": latency_ci_ms(ok, CONFIDENCE)}


def network_section(before: np.ndarray, during: np.ndarray, echo: str) -> dict:
    """The "network" section: round trips before the replay, during it, and all together (the top-level figures:
    p50/p90/p99/p999/max/mean ms with order-statistic CIs, n answered, lost). before/during: (k, 2) int64
    (t_sent_ns, round_trip_ns or -1)."""
    both = np.concatenate([before[:, 1], during[:, 1]])
    return {"method": f"DEALER -> {echo} (the runtime node's ROUTER echo, answered by libzmq without the GIL), "
                      f"{roundtrip.PROBE_BYTES}-byte probes, both timestamps on this host's monotonic clock",
            "echo": echo, **_summary(both), "before": _summary(before[:, 1]), "during": _summary(during[:, 1])}


def hil_stages(rec, per_tick: dict) -> dict[str, np.ndarray]:
    """Per-observation stage times (ms, NaN = not measured) that need no clock but this host's (HIL_STAGES)."""
    st = per_tick["stages_ms"]
    return {"send": st["send"], "obs->chunk": _obs_to_chunk_ns(rec, len(per_tick["tick"])) / 1e6,
            "control": st["control"], "command": st["command"]}


def _obs_to_chunk_ns(rec, n: int) -> np.ndarray:
    """(n,) observation sent -> its (last) chunk received, ns; NaN where no chunk was built from it."""
    slots, rows = measured_chunks(rec, row_of_tick(rec, n))
    out = np.full(n, np.nan)
    out[rows] = rec.chunks.t_recv_ns[slots] - rec.t_sent_ns[rows]
    return out


def _obs_to_command_ns(rec, n: int) -> np.ndarray:
    """(n,) observation sent -> the first command received that was planned from it (JointCommand.chunk_obs_seq),
    ns; NaN for observations no command was planned from (the runtime plans from one in replan_every_ticks)."""
    cmds, row_of = rec.commands, row_of_tick(rec, n)
    ticks = np.flatnonzero((cmds.rung != NONE) & (cmds.rung != HOLD) & (cmds.chunk_obs_seq >= 0)
                           & (cmds.chunk_obs_seq < len(row_of)))
    rows = row_of[cmds.chunk_obs_seq[ticks]]
    first = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(first, rows[rows >= 0], cmds.t_recv_ns[ticks[rows >= 0]])
    out = np.full(n, np.nan)
    planned = first != np.iinfo(np.int64).max
    out[planned] = first[planned] - rec.t_sent_ns[:n][planned]
    return out


def hil_section(rec, cfg: HilConfig, ep, echo: str, robot: str, rtt_p50_ms: float | None) -> dict:
    """The "hil" section: the port map, and observation sent -> command / chunk received (ms, with CIs), also
    minus the network round trip's median (None when no probe was answered)."""
    n = int(np.count_nonzero(rec.t_sent_ns)) if rec.interrupted else len(rec.t_sent_ns)
    sent = ~np.asarray(rec.skipped[:n], dtype=bool) if rec.skipped is not None else np.ones(n, dtype=bool)
    out = {"endpoint": cfg.endpoint, "robot_host": robot, "port_map": {**PORT_MAP},
           "endpoints": {"obs": ep.obs, "chunks": ep.chunks, "commands": ep.commands, "ready": ep.ready,
                         "status": ep.status, "echo": echo}, "curve": ep.curve_keys() is not None,
           "network_median_ms": rtt_p50_ms}
    for name, x_ns in (("obs_to_command", _obs_to_command_ns(rec, n)), ("obs_to_chunk", _obs_to_chunk_ns(rec, n))):
        x_ns = np.where(sent, x_ns, np.nan)
        out[f"{name}_ms"] = latency_summary_ms(x_ns)
        out[f"{name}_ci95_ms"] = latency_ci_ms(x_ns, CONFIDENCE)
        out[f"{name}_n"] = int(np.sum(np.isfinite(x_ns)))
        shifted = x_ns - rtt_p50_ms * 1e6 if rtt_p50_ms is not None else np.full(n, np.nan)
        out[f"{name}_minus_network_ms"] = latency_summary_ms(shifted)
        out[f"{name}_minus_network_ci95_ms"] = latency_ci_ms(shifted, CONFIDENCE)
    return out


def _same_clock_stats(summary: dict) -> dict:
    """A node's stats_summary without the histograms that mix its clock with ours."""
    lat = {k: v for k, v in summary.get("latency_us", {}).items() if k not in CROSS_CLOCK_HISTOGRAMS}
    return {**summary, "latency_us": lat}


def _plots(report: dict, per_tick: dict, out: Path, stages: dict) -> None:
    title = f"{report.get('log')} (HIL, runtime at {report['hil']['endpoint']})"
    lat, deadline_ms = per_tick["latency_ms"], float(report["deadline_ms"])
    miss = np.asarray(per_tick["outcome"]) != "on_time"
    plot_histogram(lat, deadline_ms, out / PLOT_FILES[0], title)
    plot_timeline(per_tick["t_s"], lat, miss, per_tick["rung"], deadline_ms, out / PLOT_FILES[1], title)
    plot_stages(stages, HIL_STAGES, ("receive, plan, decode, publish (the runtime's clock is not ours)",),
                out / PLOT_FILES[2], f"{title}: per-stage times")
