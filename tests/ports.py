"""Free loopback ports for tests that start nodes on fixed port blocks."""
import random
import socket


def free_port_block(n: int) -> int:
    """A base port P with P..P+n-1 all free on 127.0.0.1 (held open together while checked), below the kernel's
    ephemeral range: a ZMQ socket that keeps reconnecting to a port of that range on its own host can be given
    that very port as its source and connect to itself (TCP simultaneous open), which then blocks the bind."""
    lowest_ephemeral = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    rng = random.Random()
    for _ in range(50):
        base = rng.randrange(10_000, lowest_ephemeral - n)
        socks = []
        try:
            for p in range(base, base + n):
                socks.append(socket.socket())
                socks[-1].bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports")
