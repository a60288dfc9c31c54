"""The "coarse" rung: a DCT chunk cut short by its budget is the whole horizon from its verified coefficient rows,
above "partial" (a step chunk cut short: the verified steps only) on the fallback ladder, through the runtime,
the wire, the replayer's columns and the control loop's buffer."""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from edgeinfer.control.buffer import ChunkBuffer
from edgeinfer.core.scheduler import SchedulerConfig
from edgeinfer.core.wire import RUNGS, ActionChunk, JointCommand, Observation, decode, encode
from edgeinfer.engines.models.dct_tokenizer import DctTokenizer, constant_velocity_rad
from edgeinfer.engines.models.paths import DCT_POLICY, DEFAULT_POLICY
from edgeinfer.logs.arm_log import synthetic_log, write_schunk
from edgeinfer.node.faults import FaultConfig
from edgeinfer.node.runtime import PolicyRuntime, RuntimeConfig
from edgeinfer.sim.received import RUNG_CODE, RUNG_NAMES, Chunks, Commands
from edgeinfer.sim.replay import replay
from edgeinfer.sim.run_config import ReplayConfig

MS = 1_000_000
SCHUNK_LOG = Path(__file__).resolve().parents[2] / "shared" / "data" / "schunk_lwa4p" / "measurement_1"
STOP_AT = 9  # verified tokens when the budget runs out: one whole row of 6 joints and 3 tokens of the next


def dct_manifest(tmp_path):
    """The shipped target's weights under a DCT tokenizer of +-20 mrad per coefficient (a DCT policy as the runtime
    sees one: the manifest's tokenizer "kind" chooses it; what the tokens mean is the training's business)."""
    m = json.loads(DEFAULT_POLICY.read_text())
    h, d = m["config"]["horizon"], m["config"]["n_joints"]
    m["tokenizer"] = DctTokenizer(np.full((h, d), -0.02), np.full((h, d), 0.02), m["config"]["n_bins"]).state_dict()
    shutil.copy(DEFAULT_POLICY.with_suffix(".pt"), tmp_path / m["weights"])
    (tmp_path / "dct.json").write_text(json.dumps(m))
    return tmp_path / "dct.json"


def runtime(policy, stop_at=None):
    """A target-only runtime whose budget runs out once `stop_at` tokens are verified (None: never)."""
    rt = PolicyRuntime(RuntimeConfig(policy=policy, decode="target-only", warmup_chunks=0))
    if stop_at is not None:
        plan, plain = rt.planner.plan, rt.planner.plain_passes
        rt.planner.plan = lambda committed, remaining: None if committed >= stop_at else plan(committed, remaining)
        # a target-only stretch run in one engine call (Engine.greedy_run) stops there too
        rt.planner.plain_passes = lambda committed, remaining: min(plain(committed, remaining), stop_at - committed)
    return rt


def observation(rt, seq=0):
    return Observation(seq, 0, *rt.policy.warmup_state())


def test_a_dct_chunk_cut_mid_chunk_is_coarse_and_spans_the_whole_horizon(tmp_path):
    full = runtime(dct_manifest(tmp_path))
    h, d = full.policy.cfg.horizon, full.policy.cfg.n_joints
    obs = observation(full)
    whole = full.step(obs, budget=False)
    assert whole.rung == "full" and whole.tokens == h * d and whole.steps_rad.shape == (h + 1, d)
    tok, inc = full.policy.tokenizer, obs.q_rad - obs.q_prev_rad
    tokens = tok.encode(whole.steps_rad[1:] - obs.q_rad, inc)  # the full chunk's tokens (exact on bin centres)
    np.testing.assert_allclose(obs.q_rad + tok.decode(tokens, inc), whole.steps_rad[1:], atol=1e-12)

    cut = runtime(dct_manifest(tmp_path), stop_at=STOP_AT).step(obs, budget=False)
    assert cut.rung == "coarse" and cut.tokens == STOP_AT
    assert cut.steps_rad.shape == (h + 1, d)  # the whole horizon, from the one whole coefficient row
    np.testing.assert_array_equal(cut.steps_rad[0], obs.q_rad)
    # the first row of the same (exact, target-verified) tokens: a departure from the constant-velocity chunk of
    # the observation's last increment; the unfinished second row is left out
    assert np.abs(inc).max() > 1e-3  # a moving arm: the prior matters
    np.testing.assert_allclose(cut.steps_rad[1:], obs.q_rad + tok.decode(tokens[:d], inc), atol=1e-12)
    assert not np.allclose(cut.steps_rad[1:], obs.q_rad + tok.decode(tokens[:d], np.zeros(d)))  # not from rest
    assert not np.allclose(cut.steps_rad[1:], obs.q_rad + tok.decode(tokens[:2 * d], inc))
    assert not np.allclose(cut.steps_rad[1:], obs.q_rad + constant_velocity_rad(inc, h))  # the row is used


def test_a_step_chunk_cut_mid_chunk_is_partial_over_the_whole_horizon():
    rt = runtime(DEFAULT_POLICY, stop_at=STOP_AT)
    h, d = rt.policy.cfg.horizon, rt.policy.cfg.n_joints
    cut = rt.step(observation(rt), budget=False)
    assert cut.rung == "partial" and cut.tokens == STOP_AT
    # the anchor, the one verified step, then (target-only: no drafter) its increment repeated to the horizon
    assert cut.steps_rad.shape == (h + 1, d)
    np.testing.assert_allclose(np.diff(cut.steps_rad[1:], axis=0), np.diff(cut.steps_rad[1:3], axis=0).repeat(h - 1, 0),
                               atol=1e-12)


def test_the_early_first_row_of_a_dct_chunk_is_coarse_and_the_rest_refines_it_in_place(tmp_path):
    rt = runtime(dct_manifest(tmp_path))
    h, d = rt.policy.cfg.horizon, rt.policy.cfg.n_joints
    obs = observation(rt)
    firsts = []
    chunk = rt.step(obs, step_ns=20 * MS, budget=False, on_first_step=firsts.append)
    (first,) = firsts
    tok, inc = rt.policy.tokenizer, obs.q_rad - obs.q_prev_rad
    tokens = tok.encode(chunk.steps_rad[1:] - obs.q_rad, inc)
    assert (first.rung, first.seq, first.tokens, first.steps_rad.shape) == ("coarse", chunk.seq, d, (h + 1, d))
    np.testing.assert_allclose(first.steps_rad[1:], obs.q_rad + tok.decode(tokens[:d], inc), atol=1e-12)
    # the control loop follows the coarse whole-horizon chunk at once, and takes the rest of the chunk, which has
    # as many steps, in its place (before, "as many steps" turned the refinement away as superseded)
    buf = ChunkBuffer(blend_ns=10 * MS)
    assert buf.offer(first) is None
    q_coarse, rung, _ = buf.sample(50 * MS)
    assert rung == "coarse"
    assert buf.offer(chunk) is None
    q, rung, _ = buf.sample(50 * MS)
    assert rung == "full" and buf.boundaries == 0  # the same plan refined: no boundary, no cross-fade
    np.testing.assert_allclose(q, 0.5 * (chunk.steps_rad[2] + chunk.steps_rad[3]))
    assert not np.allclose(q, q_coarse)
    assert buf.offer(first).kind == "superseded"  # a coarser copy of the same observation is ignored


def test_rung_names_and_codes_round_trip_through_the_wire_and_the_replayer():
    assert RUNGS == ("full", "coarse", "partial", "draft", "continue", "hold")  # best first
    assert [RUNG_CODE[r] for r in RUNGS] == list(range(6)) and list(RUNG_NAMES[:6]) == list(RUNGS)
    steps = np.arange(9 * 2, dtype=float).reshape(9, 2)
    chunk = ActionChunk(3, 4, 1000, 2000, 20 * MS, steps, "coarse", 9, 9, 0, 0)
    got = decode(encode(chunk))
    assert got.rung == "coarse" and np.array_equal(got.steps_rad, steps)
    cmd = decode(encode(JointCommand(4, 4, 4, 3000, steps[1], "coarse")))
    assert cmd.rung == "coarse"
    commands, chunks = Commands(8, 2), Chunks(8, 9, 2, 4)
    assert commands.put(3500, cmd)
    chunks.put(2500, got)
    assert commands.rung[4] == RUNG_CODE["coarse"] == 1 and RUNG_NAMES[commands.rung[4]] == "coarse"
    assert chunks.chunk(0).rung == "coarse" and chunks.rung[0] == 1


def _chunk(rows, rung, t_obs=0, obs_seq=0):
    return ActionChunk(obs_seq, obs_seq, t_obs, t_obs, 10 * MS, np.asarray(rows, dtype=float), rung, 0, 0, 0, 0)


def test_a_coarse_chunk_is_interpolated_and_cross_faded_like_a_full_one():
    old = [[0.0, 0.0], [1.0, -1.0], [2.0, -2.0], [3.0, -3.0]]
    new = [[1.5, -0.5], [2.5, -1.5], [3.5, -2.5], [4.5, -3.5]]
    ts = [t * MS for t in range(0, 40, 3)]
    served = {}
    for rung in ("full", "coarse"):
        buf = ChunkBuffer(blend_ns=10 * MS)
        buf.push(_chunk(old, rung))
        before = [buf.sample(t) for t in ts[:4]]
        buf.push(_chunk(new, rung, t_obs=10 * MS, obs_seq=1))
        after = [buf.sample(t) for t in ts[4:]]
        assert {r for _, r, _ in before + after} == {rung} and buf.boundaries == 1
        served[rung] = np.array([q for q, _, _ in before + after])
    np.testing.assert_array_equal(served["coarse"], served["full"])
    np.testing.assert_allclose(served["coarse"][1], [0.3, -0.3])  # 3 ms into a 10 ms step: linear



@pytest.mark.slow
def test_a_replay_under_a_cut_budget_sends_coarse_chunks_and_holds_no_tick(tmp_path):
    """Real processes on loopback, the log at half speed (a 40 ms chunk step and budget, a 320 ms horizon): every
    target pass of the DCT policy takes at least 1 ms (node/faults.py), so the budget holds at most 39 of the 48
    passes of a target-only chunk: never a full chunk, a coarse one once six passes fit (up to 5 ms of compute
    each). Each coarse chunk spans the whole horizon: the next one, planned 40 ms later, still arrives while it covers
    the ticks unless it comes more than 280 ms after its observation (the 320 ms horizon less the 40 ms step), so no
    tick is held through a 100 ms stall; the suite's own load has stalled a runtime 330 ms, and the ticks held are
    then at most those of that lateness. The plan is built on median costs: the p99 of a loaded 2-core machine's
    passes leaves room for a pass or two. A 1 s pre-roll keeps start-up (the first chunk, late on a host the rest of
    the suite loads) out of the measured rows: this test is about steady state."""
    log = SCHUNK_LOG
    if not log.is_dir():  # without ../shared: the embedded synthetic log
        write_schunk(synthetic_log(seconds=2.0), tmp_path / "log")
        log = tmp_path / "log"
    policy = DCT_POLICY if DCT_POLICY.exists() else dct_manifest(tmp_path)
    runtime = RuntimeConfig(policy=policy, decode="target-only", warmup_chunks=6,
                            scheduler=SchedulerConfig(quantile=0.5), faults=FaultConfig(fault_pass_delay_ms=1.0))
    report = replay(ReplayConfig(log=log, duration_s=1.5, time_scale=0.5, out=tmp_path / "out", plots=False,
                                 fork_nodes=True, pre_roll_ms=1000.0, runtime=runtime), Console(quiet=True))
    n, rungs, fallbacks = report["observations_sent"], report["chunks"]["rungs"], report["fallbacks"]
    assert report["start_up"]["measured_ticks_before_first_command"] == 0, report["start_up"]
    assert report["budget_ms"] == 40.0 and report["deadline_ms"] == 8.0 and n >= 350
    assert sum(report["outcomes"].values()) == n
    assert rungs.get("full", 0) == 0 and rungs.get("partial", 0) == 0  # 39 passes never verify 48 tokens
    assert rungs.get("coarse", 0) >= 10  # one chunk per 40 ms for 3 s, whatever a 100 ms stall takes away
    ticks = (tmp_path / "out" / "ticks.csv").read_text().splitlines()
    held = [int(row.split(",")[0]) for row in ticks if row.endswith(",hold")]
    assert report["outcomes"]["hold"] == fallbacks["hold"] == len(held)
    # a hold only after a chunk later than the one before it covers (280 ms), and for no longer than that lateness
    uncovered_ms = report["chunks"]["time_to_chunk_ms"]["max"] - (320.0 - 40.0)
    period_ms = report["deadline_ms"]  # one control period at half speed (the default deadline)
    longest = max((len(run) for run in np.split(held, np.flatnonzero(np.diff(held) != 1) + 1)), default=0)
    assert longest <= max(0, int(np.ceil(uncovered_ms / period_ms)) + 1), f"held rows {held}: {report['chunks']}"
    # the ticks are served by the newest coarse chunk, or (continue) by the one before it
    assert fallbacks["coarse"] + fallbacks["continue"] == report["commands_received"] and fallbacks["coarse"] > n / 2
    # whole-horizon chunks: every one of the 8 chunk steps is compared with the recorded future
    steps = report["quality"]["chunk_steps_compared"]
    assert len(steps) == json.loads(policy.read_text())["config"]["horizon"] == 8 and min(steps) > 0
    counters = report["node_stats"]["runtime"]["counters"]  # the runtime counts every chunk it sent
    assert counters["rung.coarse"] == rungs["coarse"] + report["start_up"]["chunks"]["rungs"].get("coarse", 0)
    assert report["safety"] == {**report["safety"], "nonfinite": 0, "outside_position_limits": 0,
                                "over_velocity_limit": 0}


def test_a_dct_draft_is_the_constant_velocity_chunk_and_a_step_draft_keeps_its_verified_prefix():
    """Fewer than one whole row verified: a DCT chunk drafts with no token (its completion of no row is the
    constant-velocity chunk, which a verified part of coefficient 0 would shift at every step); a step chunk keeps its
    verified tokens and the drafter's after them."""
    from edgeinfer.core.speculative import DecodeResult
    from edgeinfer.engines.models.drafters import make_drafter
    from edgeinfer.engines.models.served import load_served_policy
    from edgeinfer.node.runtime import build_chunk, chunk_rung

    q = np.linspace(-0.5, 0.5, 6)
    q_prev = q - 0.004
    obs = Observation(7, 0, q, np.full(6, 0.2), q_prev)
    for path, kind in ((DCT_POLICY, "dct"), (DEFAULT_POLICY, "step")):
        p = load_served_policy(path)
        drafter = make_drafter("kinematic", p)
        drafter.reset(q, obs.qd_rad_s, q_prev)
        res = DecodeResult(tokens=[3, 5, 7])  # half a row verified
        rung, tokens = chunk_rung(res, p.cfg.n_tokens, 6, p.tokenizer.prefix_rung, drafter)
        chunk = build_chunk(p, obs, tokens, rung, 20_000_000, 1, res)
        assert rung == "draft" and chunk.tokens == 3
        if kind == "dct":
            assert tokens == [] and np.allclose(chunk.steps_rad[1:], q + constant_velocity_rad(q - q_prev, 8))
        else:
            assert tokens[:3] == [3, 5, 7] and len(tokens) == p.cfg.n_tokens and len(chunk.steps_rad) == 9
