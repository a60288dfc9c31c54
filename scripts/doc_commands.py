"""Run every command block of README.md and docs/*.md as written, on a fresh clone.

    python scripts/doc_commands.py              # the cheap commands (tests/test_doc_commands.py runs these)
    python scripts/doc_commands.py --long       # every command: the long ones with their smallest documented
                                                # options (about 25 min on a 2-core VM; not in CI)
    python scripts/doc_commands.py --list       # each command and how it runs here

A command block is a fenced block tagged bash, or an untagged one whose lines are commands (`edgeinfer ...`).
Each command (continuation lines joined, comments stripped) is in exactly one of CHEAP (run as written),
LONG (run as written, or with the smaller options given, by --long) or ELSEWHERE (not runnable on one host
here, with the reason and where it is run instead); tests/test_doc_commands.py fails on a command in none.

The clone: the files of this working tree that a clone would hold (tracked, or untracked and not ignored),
copied into a temporary folder beside a `shared` link to ../shared (the pages' `../shared/data`), with
`.venv/bin/{python,edgeinfer}` running this interpreter on the clone's code (PYTHONPATH): the pages' install
commands themselves are in LONG. The blocks of a page run in order, in one folder, so that a command finds what
an earlier one wrote.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGES = ("README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md")))
MEASUREMENT_1 = "../shared/data/schunk_lwa4p/measurement_1"

# run as written, in the test (seconds each)
CHEAP = {
    f".venv/bin/edgeinfer replay --log {MEASUREMENT_1} --out out/spec",
    "edgeinfer launch launch/replay.toml --dry-run",
    f"edgeinfer replay --log {MEASUREMENT_1} --budget-ms 12 --dry-run > my_replay.toml",
    "edgeinfer bench anytime --help",
    "edgeinfer keys ~/.edgeinfer/keys",
}

# command -> (what runs instead, None: as written; why it is long). Run by --long, in this order within a page.
LONG: dict[str, tuple[str | None, str]] = {
    "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/edgeinfer replay --out out":
        (None, "a new virtual environment and the base install: 1-4 min with pip's cache warm"),
    f".venv/bin/edgeinfer replay --log {MEASUREMENT_1} --out out/target --decode target-only":
        (None, "a second replay of the same log (10 s): the first is in the test"),
    "edgeinfer train --data ../shared/data/reachy2_lerobot_v30 --held-out 2 --out out/policies/reachy2_target.json":
        ("edgeinfer train --data ../shared/data/reachy2_lerobot_v30 --held-out 2 --steps 20 "
         "--out out/policies/reachy2_target.json", "3,000 steps by default (about 95 min on the 2-core VM)"),
    "edgeinfer distill --target out/policies/reachy2_target.json":
        ("edgeinfer distill --target out/policies/reachy2_target.json --steps 20", "distillation: minutes"),
    "edgeinfer replay --policy out/policies/reachy2_target.json --log ../shared/data/reachy2_lerobot_v30":
        ("edgeinfer replay --policy out/policies/reachy2_target.json --log ../shared/data/reachy2_lerobot_v30 "
         "--duration-s 2 --out out/reachy2", "a replay of a held-out episode"),
    f"edgeinfer replay --byo-spec launch/ur10_reach_policy.toml --log {MEASUREMENT_1}":
        (None, "a replay (10-20 s)"),
    f"edgeinfer replay --byo-spec launch/ur10_reach_policy.toml --byo-model "
    f"../shared/data/ur10_reach_policy/policy.pt --log {MEASUREMENT_1}":
        (None, "a replay (10-20 s)"),
    ".venv/bin/python examples/llama_policy/train.py":
        (".venv/bin/python examples/llama_policy/train.py --steps 20", "1000 steps: 7.7 CPU-minutes"),
    f"edgeinfer replay --policy examples/llama_policy/manifest.json --trust-policy-code --log {MEASUREMENT_1} "
    "--out out/llama_spec": (None, "a replay (10-20 s)"),
    f"edgeinfer replay --policy examples/llama_policy/manifest.json --trust-policy-code --log {MEASUREMENT_1} "
    "--decode target-only --out out/llama_target_only": (None, "a replay (10-20 s)"),
    "edgeinfer build --backend onnxruntime": (None, "export and quality gate: a minute"),
    "edgeinfer build --backend torch --precision fp8 --min-token-agreement 0.7": (None, "quality gate: a minute"),
    "edgeinfer replay --backend onnxruntime --out out": (None, "a replay (10-20 s)"),
    "edgeinfer bench engines --json out/bench_cpu.json":
        ("edgeinfer bench engines --rows ultrafast --ultrafast-n-obs 20 --json out/bench_cpu.json",
         "every backend and precision: many minutes"),
    "edgeinfer fleet-replay --robots 8 --phase staggered --duration-s 3 --out out/fleet": (None, "8 robots, 3 s"),
    "edgeinfer bench fleet --json out/bench/fleet.json":
        ("edgeinfer bench fleet --configs b --phases sync --max-robots 2 --duration-s 2 --settle-max-s 5 "
         "--json out/bench/fleet.json", "up to 60 points: 19 min and more"),
    "edgeinfer launch my_replay.toml": (None, "a replay (10 s)"),
    "edgeinfer launch launch/acceptance.toml": (None, "the acceptance run with faults: a minute"),
    "edgeinfer launch launch/acceptance_clean.toml": (None, "the acceptance run: a minute"),
    "edgeinfer compare out/acceptance/clean/report.json out/acceptance/faulty/report.json":
        (None, "needs the two acceptance runs above"),
    "edgeinfer bench --json out/bench_cpu.json":
        ("edgeinfer bench --scenarios quick --json out/bench_cpu.json", "~6 min idle"),
    "python scripts/perf_table.py out/bench_cpu.json": (None, "needs the bench run above"),
    "edgeinfer bench --log DIR [DIR ...] --backend onnxruntime --json out/new.json --compare out/bench_cpu.json":
        (f"edgeinfer bench --scenarios quick --log {MEASUREMENT_1} --backend onnxruntime "
         "--json out/new.json --compare out/bench_cpu.json", "a bench run; DIR is the user's"),
    "edgeinfer bench engines --rows ultrafast --json out/ultrafast_cpu.json":
        ("edgeinfer bench engines --rows ultrafast --ultrafast-n-obs 20 --json out/ultrafast_cpu.json",
         "minutes"),
    "edgeinfer bench engines --rows ultrafast --policy A.json --policy B.json --ultrafast-n-obs 100":
        ("edgeinfer bench engines --rows ultrafast --policy engines/weights/schunk_target.json "
         "--ultrafast-n-obs 20", "A.json, B.json are the user's policies"),
    "edgeinfer bench transport --json out/transport.json":
        ("edgeinfer bench transport --n 100 --n-idle 10 --n-periodic 100 --json out/transport.json", "67 s"),
    "edgeinfer bench spec --per-run 4 --ks 2,3,4,6,8 --json out/spec.json":
        ("edgeinfer bench spec --per-run 1 --ks 2 --repeats 1 --no-stress --json out/spec.json", "2 min"),
    "edgeinfer bench spec --per-run 12 --drafters early-exit --ks 3 --no-peer":
        ("edgeinfer bench spec --per-run 1 --drafters early-exit --ks 3 --no-peer --repeats 1 --no-stress",
         "a minute"),
    "edgeinfer bench --compare out/bench_cpu.json --current out/new.json": (None, "needs the two bench runs above"),
    "edgeinfer bench engines --summary out/ultrafast_cpu.json": (None, "needs the ultrafast run above"),
    "edgeinfer sweep benchmarks/sweep.toml": (None, "replays on local Ray: 3.5 min"),
    "edgeinfer bench anytime --json out/bench/anytime.json":
        ("edgeinfer bench anytime --runs 1 --budgets-ms 5 --slowdowns 4 --json out/bench/anytime.json",
         "~3 min on a quiet 2-core CPU"),
    "edgeinfer bench anytime --runs 1 6 --budgets-ms 2 5 --slowdowns 4 --json OUT.json":
        (None, "the bench on two runs: a few minutes"),
}

# not runnable on one host here: why, and where it is checked instead
ELSEWHERE = {
    "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest -q -n auto "
    "--dist worksteal": "the whole suite (minutes): CI runs this very command",
    "edgeinfer replay --byo-spec launch/legged_example.toml --byo-model my_policy.onnx --log run.mcap --extra "
    "\"imu.ang_vel=/imu:angular_velocity,imu.gravity=/imu:gravity(orientation),cmd=/cmd_vel:linear.x|linear.y|"
    "angular.z\"": "my_policy.onnx and run.mcap are the user's legged robot's (tests/test_extra_channels.py)",
    "edgeinfer fleet --endpoint tcp://127.0.0.1:5590 --report out/fleet/report.json":
        "serves until a controller's Stop or SIGINT (tests/test_fleet*.py start it)",
    "edgeinfer serve --chunks tcp://0.0.0.0:5700 --echo-endpoint tcp://0.0.0.0:5701 --obs tcp://ROBOT:5702 "
    "--ready tcp://ROBOT:5703 --status tcp://ROBOT:5704 --commands tcp://ROBOT:5705 --max-obs-age-ms 1e12 "
    "--curve-dir ~/.edgeinfer/keys": "runs on a second host, ROBOT (tests/test_hil*.py on loopback)",
    f"edgeinfer hil --endpoint tcp://HOST:5700 --log {MEASUREMENT_1} --curve-dir ~/.edgeinfer/keys":
        "needs the runtime on a second host, HOST (tests/test_hil*.py on loopback)",
    "edgeinfer sweep benchmarks/sweep.toml --address ray://HEAD:10001 --num-cpus-per-task 2":
        "needs a Ray cluster at HEAD (the local sweep above is in LONG)",
}

# exit codes a command documents besides 0: a verdict it prints, not a failure to run
VERDICT_EXIT = {
    "edgeinfer bench anytime --json out/bench/anytime.json": "1: the verdict failed (few runs: its bounds are wide)",
    "edgeinfer bench anytime --runs 1 6 --budgets-ms 2 5 --slowdowns 4 --json OUT.json": "1: the verdict failed",
    "edgeinfer bench --log DIR [DIR ...] --backend onnxruntime --json out/new.json --compare out/bench_cpu.json":
        "1: a figure regressed against the baseline",
    "edgeinfer bench --compare out/bench_cpu.json --current out/new.json": "1: a figure regressed",
}

# the extra a page names for its commands: --long installs it into the clone's own .venv (README's base install)
PAGE_EXTRAS = {"docs/speculative.md": "hf", "docs/sweeps.md": "sweep"}


@dataclass
class Command:
    page: str
    line: int  # where its block starts
    text: str  # continuation lines joined, comments stripped, spaces collapsed


def _strip_comment(line: str) -> str:
    """The line without a trailing shell comment (a # outside quotes, after a space or at the start)."""
    quote = None
    for i, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def commands(page: str, text: str | None = None) -> list[Command]:
    """The commands of `page`'s command blocks (see the module docstring), in order."""
    text = (ROOT / page).read_text() if text is None else text
    out: list[Command] = []
    for m in re.finditer(r"^```([a-z]*)\n(.*?)^```", text, flags=re.M | re.S):
        lang, body = m.group(1), m.group(2)
        lines = [_strip_comment(line).rstrip() for line in body.splitlines()]
        if lang not in ("bash", "sh", "") or (lang == "" and not any(
                line.startswith(("edgeinfer ", ".venv/bin/", "python ")) for line in lines)):
            continue
        start = text.count("\n", 0, m.start()) + 1
        joined = "\n".join(lines).replace("\\\n", " ")
        out += [Command(page, start, " ".join(line.split())) for line in joined.splitlines() if line.strip()]
    return out


def every_command() -> list[Command]:
    return [c for page in PAGES for c in commands(page)]


def how(command: str) -> tuple[str, str | None, str]:
    """(tier, what runs, why): tier cheap, long or elsewhere; what runs None for elsewhere. KeyError: unknown."""
    if command in CHEAP:
        return "cheap", command, "run as written"
    if command in LONG:
        instead, why = LONG[command]
        return "long", instead or command, why
    return "elsewhere", None, ELSEWHERE[command]


def make_clone(folder: Path) -> Path:
    """What a fresh clone of this working tree holds, at folder/main: its tracked and untracked files that git does
    not ignore (no .venv, out/, caches), `shared` beside it, .venv/bin running this interpreter on its code. numba's
    cache of the CPU engines' kernels comes along, as after a first run (numba keys it by each source file's name,
    line, size and time, which the copy keeps): the first run's compile (15-60 s) is the rest of the suite's."""
    clone = folder / "main"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file() or src.is_symlink():  # a file deleted in the working tree is not in the clone
            dst = clone / name
            dst.parent.mkdir(parents=True, exist_ok=True)
            if src.is_symlink():
                dst.symlink_to(os.readlink(src))
            else:
                shutil.copy2(src, dst)
    for compiled in ROOT.glob("engines/**/__pycache__/*.nb[ic]"):  # numba's cache: kernels compiled once already
        dst = clone / compiled.relative_to(ROOT)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(compiled, dst)
    shared = ROOT.parent / "shared"
    if shared.is_dir():
        (folder / "shared").symlink_to(shared)
    bin_dir = clone / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    (bin_dir / "edgeinfer").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m edgeinfer "$@"\n')
    (bin_dir / "edgeinfer").chmod(0o755)
    return clone


def run(clone: Path, long: bool = False, pages: tuple[str, ...] = PAGES, timeout_s: float = 900.0,
        say=print) -> list[dict]:
    """Run the commands of `pages` in the clone (cheap ones; every one with long); one dict per command: page,
    command, ran (what ran, None when skipped), returncode, ok (0, or a verdict's 1: VERDICT_EXIT), seconds,
    output (its tail when not ok)."""
    env = os.environ | {"PYTHONPATH": str(clone), "PATH": f"{clone / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
                        "HOME": str(clone.parent / "home"), "COLUMNS": "120"}
    (clone.parent / "home").mkdir(exist_ok=True)
    results, done = [], set()
    for page in pages:
        if long and page in PAGE_EXTRAS and (clone / ".venv" / "pyvenv.cfg").is_file():  # a real venv: README's
            extra = f".venv/bin/pip install -q -e '.[{PAGE_EXTRAS[page]}]'"
            say(f"{page}: {extra}")
            subprocess.run(["bash", "-c", extra], cwd=clone, env=env, check=True, timeout=timeout_s)
        for c in commands(page, (clone / page).read_text()):
            tier, ran, why = how(c.text)
            if ran in done:  # docs/replay.md repeats the README's main job: once is enough
                why, ran = "ran above", None
            if ran is None or (tier == "long" and not long):
                results.append({"page": page, "command": c.text, "ran": None, "why": why})
                continue
            done.add(ran)
            if ran.startswith("python3 -m venv"):
                ran = ran.replace("python3 -m venv .venv", f"{shlex.quote(sys.executable)} -m venv --clear .venv")
            say(f"{page}:{c.line}: {ran}")
            t0 = time.monotonic()
            try:
                res = subprocess.run(["bash", "-c", ran], cwd=clone, env=env, capture_output=True, text=True,
                                     timeout=timeout_s)
                code, output = res.returncode, res.stdout + res.stderr
            except subprocess.TimeoutExpired as e:
                code, output = None, f"timed out after {timeout_s:g} s: {e}"
            ok = code == 0 or (code == 1 and c.text in VERDICT_EXIT)
            results.append({"page": page, "command": c.text, "ran": ran, "returncode": code, "ok": ok,
                            "seconds": round(time.monotonic() - t0, 1), "output": "" if ok else output[-3000:]})
            say(f"  -> exit {code} in {results[-1]['seconds']} s")
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--long", action="store_true", help="also the long commands, with their smallest options")
    ap.add_argument("--list", action="store_true", help="print each command and how it runs here, run nothing")
    ap.add_argument("--page", action="append", default=None, help="only these pages (README.md, docs/fleet.md)")
    args = ap.parse_args(argv)
    if args.list:
        for c in every_command():
            tier, ran, why = how(c.text)
            print(f"{c.page}:{c.line} [{tier}] {c.text}" + (f"\n    runs: {ran}" if ran not in (None, c.text) else "")
                  + f"\n    ({why})")
        return 0
    with tempfile.TemporaryDirectory(prefix="doc_commands_") as tmp:
        results = run(make_clone(Path(tmp)), args.long, tuple(args.page or PAGES))
    failed = [r for r in results if r["ran"] and not r["ok"]]
    for r in failed:
        print(f"FAILED {r['page']}: {r['ran']}\n{r['output']}")
    print(f"{sum(1 for r in results if r['ran'])} commands run, {len(failed)} failed, "
          f"{sum(1 for r in results if not r['ran'])} not run here")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
