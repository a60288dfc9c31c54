"""Bench scenarios as data: a TOML file in benchmarks/ (or any path) fills these dataclasses.

    [bench]     repeats, seed
    [decode]    in-process rulers on fixed held-out observations: SingleStream (one observation at a time,
                time to first action and per token) and Offline (chunks back to back, as fast as possible)
    [floors]    raw pyzmq round trips and bare sleep-then-spin wakes
    [[replay]]  end-to-end scenarios through the real processes and sockets (sim/replay.py): a slice of each
                log replayed steady at its rate, with idle gaps (bursts separated by silence), or faster
                (time_scale 2 = observations at twice the log's rate: overload)

The scenario kinds follow MLPerf LoadGen's SingleStream / Server / Offline (mlcommons/inference, loadgen).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from edgeinfer.core.config import load, read_toml

BENCHMARKS_DIR = Path(__file__).resolve().parents[2] / "benchmarks"  # the repository's benchmarks/


@dataclass
class DecodeSuite:
    """observations: fixed held-out windows decoded one at a time per repeat; offline_chunks: chunks decoded
    back to back for throughput; warmup_chunks: untimed decodes before the first repeat."""

    observations: int = 50
    offline_chunks: int = 50
    warmup_chunks: int = 20

    def __post_init__(self):
        for name in ("observations", "offline_chunks"):
            if getattr(self, name) < 1:
                raise ValueError(f"decode.{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup_chunks < 0:
            raise ValueError(f"decode.warmup_chunks must be >= 0, got {self.warmup_chunks}")


@dataclass
class FloorSuite:
    """round_trips: timed raw pyzmq REQ/REP echoes per repeat (back to back, and again after idle gaps of
    idle_gap_ms); wake_ticks: sleep-then-spin wakes per repeat at the log's period."""

    round_trips: int = 1000
    idle_gap_ms: float = 50.0
    idle_round_trips: int = 50
    wake_ticks: int = 500

    def __post_init__(self):
        for name in ("round_trips", "idle_round_trips", "wake_ticks"):
            if getattr(self, name) < 1:
                raise ValueError(f"floors.{name} must be >= 1, got {getattr(self, name)}")
        if self.idle_gap_ms < 0:
            raise ValueError(f"floors.idle_gap_ms must be >= 0, got {self.idle_gap_ms}")


@dataclass
class ReplayScenario:
    """One end-to-end scenario. seconds: length of the log slice replayed, from start_s into the log.
    time_scale: observations at time_scale x the log's rate (2.0 = overload). burst_s/gap_s: idle gaps, the
    slice sent in bursts of burst_s separated by gap_s of silence (both or neither). deadline_ms: None = one
    control period. warmup_chunks: the runtime's untimed decodes before the start. repeats: None = the
    file's [bench] repeats (a quick file may replay once while the in-process rulers repeat)."""

    name: str
    seconds: float = 3.0
    start_s: float = 0.0
    time_scale: float = 1.0
    burst_s: float | None = None
    gap_s: float | None = None
    deadline_ms: float | None = None
    warmup_chunks: int = 30
    repeats: int | None = None

    def __post_init__(self):
        where = f"replay {self.name!r}"
        if not self.seconds > 0 or self.start_s < 0:
            raise ValueError(f"{where}: need seconds > 0 and start_s >= 0, got {self.seconds}, {self.start_s}")
        if not self.time_scale > 0:
            raise ValueError(f"{where}: time_scale must be > 0, got {self.time_scale}")
        if (self.burst_s is None) != (self.gap_s is None):
            raise ValueError(f"{where}: burst_s and gap_s go together")
        if self.burst_s is not None and not (self.burst_s > 0 and self.gap_s > 0):
            raise ValueError(f"{where}: burst_s and gap_s must be > 0, got {self.burst_s}, {self.gap_s}")
        if self.deadline_ms is not None and not self.deadline_ms > 0:
            raise ValueError(f"{where}: deadline_ms must be > 0, got {self.deadline_ms}")
        if self.warmup_chunks < 0:
            raise ValueError(f"{where}: warmup_chunks must be >= 0, got {self.warmup_chunks}")
        if self.repeats is not None and self.repeats < 1:
            raise ValueError(f"{where}: repeats must be >= 1, got {self.repeats}")


@dataclass
class Scenarios:
    """A whole scenarios file. repeats: every ruler is measured this many times and the median quoted."""

    repeats: int = 3
    seed: int = 0
    decode: DecodeSuite = field(default_factory=DecodeSuite)
    floors: FloorSuite = field(default_factory=FloorSuite)
    replay: list[ReplayScenario] = field(default_factory=list)
    source: str = ""

    def __post_init__(self):
        if self.repeats < 1:
            raise ValueError(f"bench.repeats must be >= 1, got {self.repeats}")
        names = [r.name for r in self.replay]
        if len(set(names)) != len(names):
            raise ValueError(f"replay scenario names repeat: {names}")


def resolve(name_or_path: str) -> Path:
    """A scenarios file: a name in benchmarks/ ("default", "quick") or a path. Raises FileNotFoundError."""
    path = Path(name_or_path)
    if not path.suffix:
        path = BENCHMARKS_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in BENCHMARKS_DIR.glob("*.toml"))
        raise FileNotFoundError(f"scenarios file not found: {path} (names in {BENCHMARKS_DIR}: {known})")
    return path


@dataclass
class BenchTable:
    """The [bench] table of a scenarios file."""

    repeats: int = 3  # every ruler is measured this many times and the median quoted
    seed: int = 0  # seed of the held-out observation sample


@dataclass
class ScenariosFile:
    """A scenarios file as written: [bench], [decode], [floors] and the [[replay]] tables."""

    bench: BenchTable = field(default_factory=BenchTable)  # repeats and seed
    decode: DecodeSuite = field(default_factory=DecodeSuite)  # the in-process rulers
    floors: FloorSuite = field(default_factory=FloorSuite)  # the zmq and wake-up floors
    replay: list[dict] = field(default_factory=list)  # one ReplayScenario per [[replay]] table


def load_scenarios(name_or_path: str) -> Scenarios:
    """Parse a scenarios file. Raises FileNotFoundError, or ValueError naming the file and the table."""
    path = resolve(name_or_path)
    doc = load(ScenariosFile, read_toml(path), file=path)
    return Scenarios(repeats=doc.bench.repeats, seed=doc.bench.seed, decode=doc.decode, floors=doc.floors,
                     replay=[load(ReplayScenario, r, f"[[replay]] #{i + 1}", file=path)
                             for i, r in enumerate(doc.replay)],
                     source=str(path))
