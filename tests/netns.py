"""Two test hosts joined by a real network link: Linux network namespaces and a veth pair (iproute2), shaped
with tc netem where the kernel has it. Needs CAP_NET_ADMIN; `unavailable()` says what is missing so that tests
skip by capability instead of failing.

    namespace <prefix>_rt (runtime host)  10.<n>.0.1  <== veth ==>  10.<n>.0.2  namespace <prefix>_rb (robot host)
"""
from __future__ import annotations

import os
import shutil
import subprocess


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def unavailable() -> str | None:
    """Why a network-namespace test cannot run here (None: it can): no iproute2, or no right to add a namespace."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` is not installed (.ci/run installs it when it runs as root)"
    probe = f"eiprobe{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace (CAP_NET_ADMIN?): {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class VethLink:
    """A runtime host and a robot host joined by a veth pair. Use as a context manager; `close()` deletes both
    namespaces (and with them the pair). Raises subprocess.CalledProcessError when `ip` refuses a step."""

    def __init__(self, prefix: str = "ei"):
        self.subnet = 16 + os.getpid() % 200  # one /24 per test process, so parallel runs do not collide
        self.rt, self.rb = f"{prefix}{os.getpid()}rt", f"{prefix}{os.getpid()}rb"
        self.rt_addr, self.rb_addr = f"10.{self.subnet}.0.1", f"10.{self.subnet}.0.2"
        self._dev = {self.rt: "veth_rt", self.rb: "veth_rb"}

    def __enter__(self) -> VethLink:
        try:
            for ns in (self.rt, self.rb):
                _ip("netns", "add", ns)
            _ip("link", "add", "veth_rt", "netns", self.rt, "type", "veth", "peer", "name", "veth_rb", "netns", self.rb)
            for ns, addr in ((self.rt, self.rt_addr), (self.rb, self.rb_addr)):
                _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", self._dev[ns])
                _ip("-n", ns, "link", "set", self._dev[ns], "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for ns in (self.rt, self.rb):
            _ip("netns", "del", ns, check=False)

    def shape(self, delay_ms: float, jitter_ms: float, loss_pct: float) -> str | None:
        """tc netem on both ends (each direction gets the delay, jitter and loss once). Returns None when
        shaped, else why not (the kernel lacks sch_netem: CONFIG_NET_SCH_NETEM)."""
        for ns in (self.rt, self.rb):
            r = subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", self._dev[ns], "root", "netem",
                                "delay", f"{delay_ms}ms", f"{jitter_ms}ms", "loss", f"{loss_pct}%"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                return f"tc netem refused: {r.stderr.strip()} (the kernel needs CONFIG_NET_SCH_NETEM)"
        return None

    def cut(self) -> None:
        """Take the link down at the runtime's end: packets stop both ways, nothing is closed or reset."""
        _ip("-n", self.rt, "link", "set", "veth_rt", "down")

    def run_in(self, ns: str, argv: list[str]) -> list[str]:
        """argv run inside namespace `ns`."""
        return ["ip", "netns", "exec", ns, *argv]
