"""The robot-count ladder of `edgeinfer bench fleet` and its headline, as pure functions of the measured points.

Per (configuration, phase) the bench measures N = 1, 2, 4, 8, ... robots (capped at max_robots, the cap itself the
last step) until a point breaks, then one more step, and stops. A point is a dict with at least

    robots_requested   N, the robots started
    robots_admitted    the robots the runtime admitted (refused robots are not served)
    attainment_worst   the lowest chunk deadline attainment of a served robot (None: no served robot, or none
                       with a chunk)
    control_miss_worst the highest steady-state control-miss rate of a served robot (None: as above)

It *passes* when it serves a robot and every served robot keeps the bar: attainment >= ATTAINMENT_BAR and
steady-state control misses <= MISS_BAR (the fleet's headline bar, per robot: a served robot is served at the bar).
It *breaks* when it does not pass, or when the runtime refused a robot (the fleet is full: more robots can only be
refused). The headline of a ladder is the most robots served at a passing point.
"""
from __future__ import annotations

ATTAINMENT_BAR = 0.999  # chunk deadline attainment a served robot keeps (fraction of its chunks)
MISS_BAR = 0.001  # steady-state control-miss rate a served robot stays under (fraction of its ticks)


def passes(point: dict) -> bool:
    """Whether `point` serves at least one robot and every served robot keeps the bar (module docstring)."""
    att, miss = point.get("attainment_worst"), point.get("control_miss_worst")
    return point["robots_admitted"] > 0 and att is not None and miss is not None and att >= ATTAINMENT_BAR \
        and miss <= MISS_BAR


def breaks(point: dict) -> bool:
    """Whether the ladder breaks at `point`: it does not pass, or a robot was refused (the fleet is full)."""
    return not passes(point) or point["robots_admitted"] < point["robots_requested"]


def ladder(max_robots: int) -> list[int]:
    """Every N a ladder may measure: 1, 2, 4, ... below max_robots, then max_robots."""
    out = [1]
    while out[-1] < max_robots:
        out.append(min(2 * out[-1], max_robots))
    return out


def next_robots(points: list[dict], max_robots: int) -> int | None:
    """The next N of a ladder given its points so far (in the order measured), or None when it is done: 1 first,
    then twice the last N (max_robots when that is over it); done one step after the first point that breaks, or
    after N = max_robots. Raises ValueError for max_robots < 1, or a last N that is not on the ladder."""
    if max_robots < 1:
        raise ValueError(f"max_robots must be >= 1, got {max_robots}")
    if not points:
        return 1
    first_break = next((i for i, p in enumerate(points) if breaks(p)), None)
    steps = ladder(max_robots)
    at = steps.index(points[-1]["robots_requested"])
    if (first_break is not None and first_break < len(points) - 1) or at == len(steps) - 1:
        return None
    return steps[at + 1]


def headline(points: list[dict], max_robots: int) -> dict:
    """One ladder's headline: robots_served (the most robots served at a passing point; 0 when none passes),
    at_robots (the N requested there), first_break_at (the N of the first point that breaks; None: none broke),
    capped (the ladder ended at max_robots without breaking: robots_served is a lower bound), non_monotone (a point
    passed after one failed the bar: noise on the machine, read the points)."""
    passing = [p for p in points if passes(p)]
    best = max(passing, key=lambda p: (p["robots_admitted"], -p["robots_requested"]), default=None)
    first = next((i for i, p in enumerate(points) if breaks(p)), None)
    failed = next((i for i, p in enumerate(points) if not passes(p)), None)
    return {"robots_served": best["robots_admitted"] if best else 0,
            "at_robots": best["robots_requested"] if best else None,
            "first_break_at": points[first]["robots_requested"] if first is not None else None,
            "capped": first is None and bool(points) and points[-1]["robots_requested"] >= max_robots,
            "non_monotone": failed is not None and any(passes(p) for p in points[failed + 1:])}


def ratio(top: dict, base: dict) -> float | None:
    """top's robots served over base's (e.g. d / a), from two headlines; None when base serves none."""
    return top["robots_served"] / base["robots_served"] if base["robots_served"] else None
