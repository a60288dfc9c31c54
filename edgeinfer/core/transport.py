"""ZeroMQ sockets for edgeinfer messages: bounded queues, no lingering, latest-only receive.

Every socket gets LINGER 0 (closing never waits on unsent data) and a bounded SNDHWM/RCVHWM,
so a slow or dead peer costs dropped messages, never memory or a blocked control loop.

Start handshake (PUB/SUB slow joiner): a SUB connecting to a PUB receives nothing until its
subscription has reached the publisher, and PUB silently drops everything sent before that.
So before the run starts:

1. The coordinator binds a PULL "ready" socket and calls `wait_until_subscribed`, which
   publishes `Hello(sender, i, t_ns)` on its PUB every ~10 ms.
2. Each peer connects its SUB sockets and a PUSH to the ready endpoint, keeps reading its SUBs
   until it has received a Hello on *every* SUB it needs (`wait_for_hello`), then calls
   `announce_ready(push, name)`, which sends `Hello(name, ...)` on the PUSH.
3. Once every expected name has arrived on the ready PULL, `wait_until_subscribed` returns.

A Hello received on a SUB proves that subscription is live on the publisher, so no later
message on that socket can be lost to the slow joiner (only to a full HWM). Where a peer
subscribes to several publishers, each of them must be publishing Hellos while the peer waits.
Hellos may still be queued on a SUB after the handshake: consumers skip `Hello` messages.

Security: endpoints are loopback unless a caller passes others. A run given keys (curve_dir), or with a
non-loopback endpoint (which then needs them), or any with curve="on", uses ZeroMQ CURVE (RFC 26 CurveZMQ:
encryption and, through a ZAP handler, client authentication) with the keys `edgeinfer keys DIR` writes
(edgeinfer.core.keys): every bound socket is a CURVE server, every connecting socket a client whose public key
must sit in DIR/authorized_clients. A side that speaks CURVE to one that does not fails the ZMTP handshake, and
libzmq never retries it: every socket watches its handshakes from its creation (SocketEvents), and the start-up
waits raise HandshakeError naming the mismatch and its fix within a poll (check_handshakes).
"""

import errno
import ipaddress
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, NamedTuple

import zmq
from zmq.utils.monitor import recv_monitor_message

from edgeinfer.core.wire import MAX_FRAMES, Hello, Message, WireError, check_joints, decode, encode

DEFAULT_HWM = 100
# Queue (RCVHWM) of a latest-only reader's socket (Receiver(latest=...)). With a queue of DEFAULT_HWM the ZMQ I/O
# thread stops reading TCP once it is full, so a backlog waits in the kernel, unseen: a reader that empties the
# queue takes an old message for the newest. This deep, everything sent arrives in the queue (40 s at 250 Hz).
LATEST_HWM = 10_000
READ_LIMIT = 256  # messages one drain() or recv_latest() reads at most: a flood cannot pin the caller
HELLO_PERIOD_MS = 10
# ZMQ_MAXMSGSIZE of every socket: the memory one frame may take, a hard cap far above any valid frame (headers are at
# most wire.MAX_HEADER_BYTES, the largest array 256 x 64 x 8 = 128 KiB). libzmq treats a bigger frame as a protocol
# error and drops the connection for good (a SUB does not reconnect), so the wire limits are not set here: decode
# refuses a frame over them ("oversize", counted) with the connection kept. A frame over 64 MiB still costs the link
# its in-flight messages: the nodes' connecting sockets are healed by liveliness.LinkMonitor (links_relinked).
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
RECONNECT_IVL_MS = 10  # a restarted peer is reconnected to within about this (libzmq's default is 100 ms)


@dataclass
class Endpoints:
    """ZMQ endpoints of one run; tcp://127.0.0.1 unless a caller passes others."""

    obs: str  # Observation, replayer/robot PUB -> SUBs
    chunks: str  # ActionChunk, runtime PUB -> control (and replayer) SUBs
    commands: str  # JointCommand, control -> replayer
    ready: str  # handshake: peers PUSH Hello -> coordinator PULL
    status: str | None = None  # control loop's Heartbeat, ErrorEvent, Stats (PUB bound by control); None: off
    # auto: CURVE when keys are given (curve_dir) or an endpoint is not loopback (which then needs them). The keys
    # decide, not this side's addresses: the two sides of one run see different ones (a runtime bound on 0.0.0.0,
    # a robot side connecting to 127.0.0.1), and must still agree.
    curve: Literal["auto", "on", "off"] = "auto"
    curve_dir: Path | None = None  # keys written by `edgeinfer keys DIR`

    def __post_init__(self):
        self.curve_dir = Path(self.curve_dir) if self.curve_dir is not None else None
        if self.curve == "on" and self.curve_dir is None:
            raise ValueError("Endpoints.curve='on' needs curve_dir (make keys with `edgeinfer keys DIR`)")

    def all(self) -> list[str]:
        return [e for e in (self.obs, self.chunks, self.commands, self.ready, self.status) if e]

    def curve_keys(self) -> "CurveKeys | None":
        """The CURVE keys every socket of this run uses, or None for plain TCP (see the module docstring): keys
        whenever curve_dir is given (unless curve="off"). Raises ValueError for a non-loopback endpoint with
        curve="auto" and no keys: nothing unencrypted leaves the host unless curve="off" says so."""
        if self.curve == "off":
            return None
        remote = [e for e in self.all() if not is_loopback(e)]
        if self.curve == "auto" and not remote and self.curve_dir is None:
            return None
        if self.curve_dir is None:
            raise ValueError(f"Endpoints: {remote} are not loopback: give curve_dir (keys from `edgeinfer keys "
                             "DIR`) or set curve='off' to send unencrypted")
        return CurveKeys.load(self.curve_dir)

    @classmethod
    def free_loopback(cls) -> "Endpoints":
        """Five distinct free TCP ports on 127.0.0.1 (asked of the kernel via port 0).

        The ports are released before return, so another process could take one in between;
        good enough for tests and single-host runs.
        """
        socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(5)]
        try:
            for s in socks:  # all held open at once so the four ports differ
                s.bind(("127.0.0.1", 0))
            ports = [s.getsockname()[1] for s in socks]
        finally:
            for s in socks:
                s.close()
        return cls(*(f"tcp://127.0.0.1:{p}" for p in ports))


def is_loopback(endpoint: str) -> bool:
    """True for ipc://, inproc:// and tcp:// on 127.0.0.0/8, ::1 or localhost."""
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # an interface name or a host name: not provably local
        return False


@dataclass
class CurveKeys:
    """Z85 CURVE keys (bytes) of a run: the server pair (bound sockets) and a client pair (connecting ones),
    plus the directory of client public keys the ZAP handler accepts."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes
    authorized_dir: Path

    @classmethod
    def load(cls, key_dir: Path) -> "CurveKeys":
        """Read DIR/server.key_secret, DIR/client.key_secret (edgeinfer.core.keys). Raises ValueError naming the
        file that is missing or unreadable."""
        import zmq.auth

        pairs = []
        for name in ("server", "client"):
            path = Path(key_dir) / f"{name}.key_secret"
            try:
                public, secret = zmq.auth.load_certificate(path)
            except (OSError, ValueError) as e:
                raise ValueError(f"{path}: cannot read CURVE key ({e}); make keys with `edgeinfer keys "
                                 f"{key_dir}`") from None
            if secret is None:
                raise ValueError(f"{path}: no secret key in this file")
            pairs += [public, secret]
        return cls(*pairs, authorized_dir=Path(key_dir) / "authorized_clients")


def start_authenticator(ctx: zmq.Context, keys: CurveKeys | None):
    """For a CURVE run: a ZAP handler thread on `ctx` accepting only the client keys in keys.authorized_dir
    (stop it with .stop() before destroying the context). None when keys is None."""
    if keys is None:
        return None
    from zmq.auth.thread import ThreadAuthenticator

    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(keys.authorized_dir))
    return auth


class HandshakeError(ConnectionError):
    """A ZMTP handshake with a peer failed for a reason no retry can mend (CURVE on one side only, keys that do not
    match): libzmq drops such a link for good and says so only to a socket monitor. The message names the endpoint
    and the fix."""


# Failed ZMTP handshakes: a CURVE socket meeting a plain one (a mechanism mismatch), a server key the client does
# not hold (cryptographic), a client key the ZAP handler refuses (auth). libzmq never retries these links.
_HANDSHAKE_FAILED = (zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                     | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
# How long a side that found a failed handshake keeps its sockets up before it raises: the peer's next tries
# (RECONNECT_IVL_MS apart) then meet this side's greeting, so that it learns the same, rather than being refused by
# a port already closed and left to retry until its timeout.
HANDSHAKE_GRACE_S = 3.0  # a peer that starts late on a loaded host (a fresh interpreter: seconds) still meets it
_FIX = ("start both sides with the same keys (--curve-dir DIR, the folder `edgeinfer keys DIR` wrote, copied to "
        "both hosts) or both with --curve off")


class SocketEvents:
    """The connection events of one socket, from a zmq_socket_monitor attached before it binds or connects (a
    handshake that fails for a protocol error is tried once, at the first connection: a monitor attached later never
    hears of it). Read without blocking; everything that watches the socket reads through this one object
    (check_handshakes; liveliness.LinkMonitor's connected/disconnected counts), so none takes another's events.
    curve: whether this socket speaks CURVE (for the mismatch's message)."""

    EVENTS = _HANDSHAKE_FAILED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED

    def __init__(self, sock: zmq.Socket, curve: bool):
        self.sock, self.curve = sock, curve
        self.mon = sock.get_monitor_socket(self.EVENTS)
        self.up = self.down = 0  # handshakes succeeded, links dropped: since the last take()
        self.failed: list[tuple[int, int, str]] = []  # (event, value, endpoint) of each failed handshake, unread

    def poll(self) -> None:
        """Read every event queued (never blocks; a closed socket has none)."""
        while not self.mon.closed:
            try:
                event = recv_monitor_message(self.mon, flags=zmq.NOBLOCK)
            except zmq.ZMQError:  # zmq.Again: none queued
                return
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self.down += 1
            elif event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self.up += 1
            elif event["event"] & _HANDSHAKE_FAILED:
                endpoint = event["endpoint"].decode(errors="replace")
                self.failed.append((int(event["event"]), int(event["value"]), endpoint))

    def take(self) -> tuple[int, int]:
        """(handshakes succeeded, links dropped) since the last call."""
        self.poll()
        out, self.up, self.down = (self.up, self.down), 0, 0
        return out

    def close(self) -> None:
        if not self.mon.closed:
            if not self.sock.closed:
                self.sock.disable_monitor()
            self.mon.close(linger=0)


class _Socket(zmq.Socket):
    """A zmq.Socket whose close() also closes its SocketEvents' monitor (a PAIR left open would block ctx.term())."""

    _events: SocketEvents | None = None

    def close(self, linger: int | None = None) -> None:
        if self._events is not None and not self.closed:
            self._events.close()
        super().close(linger=linger)


def socket_events(sock: zmq.Socket) -> SocketEvents | None:
    """The SocketEvents of a socket made here (None for another)."""
    return getattr(sock, "_events", None)


def _describe_failure(event: int, value: int, endpoint: str, curve: bool) -> str | None:
    """One line for a failed handshake no retry mends (None for one that might be a stranger's noise)."""
    mine = "this side uses CURVE encryption" if curve else "this side does not use CURVE encryption"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH:
        theirs = "the peer does not" if curve else "the peer does"
        return f"{endpoint}: CURVE mismatch: {mine} and {theirs}; {_FIX}"
    if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == zmq.PROTOCOL_ERROR_ZMTP_CRYPTOGRAPHIC:
        return f"{endpoint}: CURVE keys do not match the peer's (another keys folder); {_FIX}"
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (f"{endpoint}: a peer's CURVE client key is not in this side's authorized_clients (ZAP status {value}); "
                f"{_FIX}")
    return None


def check_handshakes(*socks: zmq.Socket) -> None:
    """Raise HandshakeError, in one line naming the endpoint and the fix, when a peer's handshake with one of
    `socks` failed for good (CURVE on one side only, keys that differ). For start-up waits, every poll: the
    handshake functions here and the nodes' own call it, so a mismatch ends both sides within a poll."""
    for sock in socks:
        if (events := socket_events(sock)) is None:
            continue
        events.poll()
        for event, value, endpoint in events.failed:
            if (text := _describe_failure(event, value, endpoint, events.curve)) is not None:
                events.failed.clear()
                time.sleep(HANDSHAKE_GRACE_S)  # the I/O thread keeps answering the peer meanwhile
                raise HandshakeError(text)
        events.failed.clear()


def _socket(ctx: zmq.Context, kind: int, endpoint: str, bind: bool, hwm: int,
            curve: CurveKeys | None = None, identity: str | None = None) -> zmq.Socket:
    if hwm < 1:  # 0 would mean "unbounded" to ZMQ, which we never want
        raise ValueError(f"hwm must be >= 1, got {hwm}")
    sock = ctx.socket(kind, socket_class=_Socket)
    try:
        sock._events = SocketEvents(sock, curve is not None)  # before bind/connect: see SocketEvents
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, hwm)
        sock.setsockopt(zmq.RCVHWM, hwm)
        sock.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
        if curve is not None and bind:
            sock.curve_server = True
            sock.curve_publickey, sock.curve_secretkey = curve.server_public, curve.server_secret
        elif curve is not None:
            sock.curve_serverkey = curve.server_public
            sock.curve_publickey, sock.curve_secretkey = curve.client_public, curve.client_secret
        if kind == zmq.SUB:
            sock.setsockopt(zmq.SUBSCRIBE, b"")  # before connect, so no message predates it
        if identity is not None:  # a DEALER's routing id: set before connect, as the ROUTER reads it then
            sock.setsockopt(zmq.IDENTITY, identity.encode())
        if bind:
            sock.bind(endpoint)
        else:
            sock.connect(endpoint)
    except zmq.ZMQError as e:
        sock.close()
        if e.errno in (zmq.EADDRINUSE, zmq.EADDRNOTAVAIL, zmq.EINVAL, zmq.EPROTONOSUPPORT, errno.EACCES):
            raise EndpointError(e.errno, endpoint, bind) from None
        raise
    return sock


class EndpointError(zmq.ZMQError, OSError):
    """An endpoint that cannot be bound or connected (in use, not this host's address, malformed): one line naming
    it (filename: the endpoint, so that the command line can name the option that gave it)."""

    def __init__(self, errno_: int, endpoint: str, bind: bool):
        super().__init__(errno_)
        self.filename = endpoint
        hint = {zmq.EADDRINUSE: " (another process is on this port: stop it or pick another port)",
                zmq.EADDRNOTAVAIL: " (not an address of this host)"}.get(errno_, "")
        self.text = f"cannot {'bind' if bind else 'connect to'} {endpoint}: {zmq.strerror(errno_)}{hint}"

    def __str__(self) -> str:
        return self.text


def pub(ctx: zmq.Context, endpoint: str, bind: bool = True, hwm: int = DEFAULT_HWM,
        curve: CurveKeys | None = None, nodrop: bool = False) -> zmq.Socket:
    """PUB socket; raises zmq.ZMQError when the endpoint cannot be bound/connected. nodrop: an XPUB with
    XPUB_NODROP, whose send raises zmq.Again (transport.send: False) where a PUB would drop silently at its HWM,
    so that the sender knows and counts (the replayer; subscriptions queued on it need not be read)."""
    sock = _socket(ctx, zmq.XPUB if nodrop else zmq.PUB, endpoint, bind, hwm, curve)
    if nodrop:
        sock.setsockopt(zmq.XPUB_NODROP, 1)
    return sock


def sub(ctx: zmq.Context, endpoint: str, bind: bool = False, hwm: int = DEFAULT_HWM,
        curve: CurveKeys | None = None) -> zmq.Socket:
    """SUB socket subscribed to everything."""
    return _socket(ctx, zmq.SUB, endpoint, bind, hwm, curve)


def push(ctx: zmq.Context, endpoint: str, bind: bool = False, hwm: int = DEFAULT_HWM,
         curve: CurveKeys | None = None) -> zmq.Socket:
    """PUSH socket (connects by default: many pushers, one puller)."""
    return _socket(ctx, zmq.PUSH, endpoint, bind, hwm, curve)


def pull(ctx: zmq.Context, endpoint: str, bind: bool = True, hwm: int = DEFAULT_HWM,
         curve: CurveKeys | None = None) -> zmq.Socket:
    """PULL socket (binds by default)."""
    return _socket(ctx, zmq.PULL, endpoint, bind, hwm, curve)


def dealer(ctx: zmq.Context, endpoint: str, identity: str, hwm: int = DEFAULT_HWM,
           curve: CurveKeys | None = None) -> zmq.Socket:
    """DEALER socket connecting to a ROUTER, with routing id `identity` (a fleet robot: its name)."""
    return _socket(ctx, zmq.DEALER, endpoint, False, hwm, curve, identity)


def recv_frames(sock: zmq.Socket, flags: int = 0, envelope: int = 0) -> list[zmq.Frame]:
    """The frames of the next message on `sock`, received without copying (zmq.Frame: a view of libzmq's buffer;
    decode checks every size on it before it copies anything). `envelope`: frames before the wire message (a
    ROUTER's routing id: 1). Raises zmq.Again (flags=zmq.NOBLOCK, none queued), and WireError (kind "frames") for a
    message of more than envelope + wire.MAX_FRAMES frames, after reading its other frames and dropping them
    unkept (about 0.7 us a frame): the socket is left at the next message."""
    frame = sock.recv(flags, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(copy=False)  # the parts of a message arrive together: never blocks
        if len(frames) < envelope + MAX_FRAMES:
            frames.append(frame)
        else:  # one too many: read the rest, keep none of it
            n = len(frames) + 1
            while frame.more:
                frame = sock.recv(copy=False)
                n += 1
            raise WireError(f"frames: got {n - envelope}, expected 1..{MAX_FRAMES}", "frames")
    return frames


def send(sock: zmq.Socket, msg: Message) -> bool:
    """Send `msg` without blocking; False when the send queue is full (HWM reached, nobody reading).

    The caller counts the Falses; the control path must never wait on a socket. A PUB never
    returns False: at its HWM it drops silently. Small messages are copied into ZMQ (cheaper
    than pyzmq's zero-copy bookkeeping, measured); a message with a frame of COPY_THRESHOLD
    bytes or more goes zero-copy, so do not mutate the arrays of `msg` after sending.
    Raises WireError when `msg` is not encodable.
    """
    frames = encode(msg)
    big = any(len(f) >= zmq.COPY_THRESHOLD for f in frames)
    try:
        sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=not big)
    except zmq.Again:
        return False
    return True


class LockedSender:
    """One socket shared by two threads (a node's main loop and its heartbeat beacon): ZMQ sockets are not
    thread-safe, and the lock serialises every send (and gives the memory barrier ZMQ asks for)."""

    def __init__(self, sock: zmq.Socket):
        self.sock, self.lock = sock, threading.Lock()

    def send(self, msg: Message) -> bool:
        """transport.send under the lock."""
        with self.lock:
            return send(self.sock, msg)


class Latest(NamedTuple):
    """What Receiver.recv_latest read: the newest message of the Receiver's `latest` type, the other messages."""

    msg: Message | None  # the newest of the type, once the queue was read to its end; None: none, or not there yet
    others: list[Message]  # every valid message of other types read, oldest first
    count: int  # messages of the type read by this call: msg, if any, and the older ones it superseded


class Receiver:
    """Decoding reader for one socket; malformed messages are counted and skipped, never fatal.

    Counters: `received` (valid messages decoded), `malformed` (messages that raised WireError;
    `malformed_by_kind` per wire.ERROR_KINDS, `last_error` keeps the newest text), `stale_dropped`
    (messages of type `latest` superseded by a newer one in `recv_latest`). `on_error(WireError)`, if given, is
    called for each malformed message (e.g. to publish a rate-limited ErrorEvent). `latest`: the message type
    this reader takes latest-only (recv_latest); its socket needs RCVHWM >= LATEST_HWM (ValueError otherwise).
    `joints`: the joint count D every Observation, ActionChunk and JointCommand must carry (wire.check_joints),
    another one counted as malformed (kind "joints"); None: any D 1..MAX_JOINTS. Messages are received without a
    copy (recv_frames): frame count and sizes are checked before anything is copied.
    The Receiver does not own the socket unless `close()` is called.
    """

    def __init__(self, sock: zmq.Socket, on_error: Callable[[WireError], None] | None = None,
                 latest: type | None = None, joints: int | None = None):
        if latest is not None and sock.getsockopt(zmq.RCVHWM) < LATEST_HWM:
            raise ValueError(f"Receiver(latest={latest.__name__}): the socket's RCVHWM is "
                             f"{sock.getsockopt(zmq.RCVHWM)}, a latest-only reader needs >= LATEST_HWM "
                             f"({LATEST_HWM}): a shallow queue leaves the newest messages unseen in the kernel")
        self.sock = sock
        self.received = 0
        self.malformed = 0
        self.malformed_by_kind: Counter[str] = Counter()
        self.stale_dropped = 0
        self.last_error = ""
        self.on_error = on_error
        self.latest = latest
        self.joints = joints
        self._newest: Message | None = None  # of type `latest`, read by a recv_latest that did not reach the end
        self._poller = zmq.Poller()  # one for the Receiver's life: Socket.poll builds a new one per call
        self._poller.register(sock, zmq.POLLIN)

    def _read(self, flags: int) -> Message | None:
        """The next message received (recv_frames) and decoded; None when it was malformed. Raises zmq.Again."""
        try:
            frames = recv_frames(self.sock, flags)
        except WireError as e:
            return self._malformed(e)
        return self._decode(frames)

    def _decode(self, frames: list[Any]) -> Message | None:
        try:
            msg = decode(frames)
            if self.joints is not None:
                check_joints(msg, self.joints)
        except WireError as e:  # a bad peer must not take the reader down with it
            return self._malformed(e)
        self.received += 1
        return msg

    def _malformed(self, e: WireError) -> None:
        self.malformed += 1
        self.malformed_by_kind[e.kind] += 1
        self.last_error = str(e)
        if self.on_error is not None:
            self.on_error(e)

    def recv(self, timeout_ms: int) -> Message | None:
        """Next valid message, waiting up to `timeout_ms` (>= 0) ms; None on timeout."""
        if timeout_ms < 0:
            raise ValueError(f"timeout_ms must be >= 0, got {timeout_ms}")
        deadline_ns = time.perf_counter_ns() + timeout_ms * 1_000_000
        while True:
            left_ms = max(0, (deadline_ns - time.perf_counter_ns() + 999_999) // 1_000_000)
            if not self._pending() and not self._poller.poll(left_ms):
                return None
            msg = self._read(0)
            if msg is not None:
                return msg

    def drain(self, limit: int = READ_LIMIT) -> list[Message]:
        """Valid messages already queued, oldest first, from at most `limit` received (valid or not), so that a
        flood (of garbage, say) cannot pin the caller in here: it gets back to its loop and serves what it has."""
        out = []
        for _ in range(limit):
            msg = self._next()
            if msg is False:
                break
            if msg is not None:
                out.append(msg)
        return out

    def recv_latest(self, timeout_ms: int, limit: int = READ_LIMIT) -> Latest:
        """The newest queued message of type `latest` and every other valid message, waiting up to `timeout_ms`
        ms for the first; older messages of the type are dropped (counted in `stale_dropped`).

        Never stale: the newest is returned only once the queue is empty (LATEST_HWM keeps the whole backlog
        there, not in the kernel). At most `limit` messages are read per call; when more are queued, `msg` is
        None and the newest so far is kept for the next call, which goes on reading. ZMQ_CONFLATE would keep
        only the newest in the socket, but it does not support multipart messages.
        """
        if self.latest is None:
            raise ValueError("recv_latest needs a Receiver made with latest=<message type>")
        others: list[Message] = []
        count = 0
        if self._newest is None and not self._pending() and not self._poller.poll(timeout_ms):
            return Latest(None, others, count)
        for _ in range(limit):
            msg = self._next()
            if msg is False:
                break
            if isinstance(msg, self.latest):
                count += 1
                self.stale_dropped += self._newest is not None
                self._newest = msg
            elif msg is not None:
                others.append(msg)
        else:
            if self._pending():  # the limit, with more queued: the newest is not known yet
                return Latest(None, others, count)
        newest, self._newest = self._newest, None  # the queue is empty: the one held is the newest
        return Latest(newest, others, count)

    def take_newest(self) -> Message | None:
        """The newest message of type `latest` read by a recv_latest that stopped at its limit (None: none), and
        forget it: for a reader whose read budget ran out in a flood, newer than anything it had."""
        newest, self._newest = self._newest, None
        return newest

    def _next(self) -> Message | None | Literal[False]:
        """The next queued message decoded (None: it was malformed), False when none is queued."""
        if not self._pending():  # cheaper than a NOBLOCK recv raising zmq.Again
            return False
        try:
            return self._read(zmq.NOBLOCK)
        except zmq.Again:
            return False

    def _pending(self) -> bool:
        return bool(self.sock.getsockopt(zmq.EVENTS) & zmq.POLLIN)

    def close(self) -> None:
        self.sock.close(linger=0)


def announce_ready(push_sock: zmq.Socket, name: str) -> bool:
    """Peer side of the handshake: report `name` ready. Call only after `wait_for_hello`."""
    return send(push_sock, Hello(name, 0, time.perf_counter_ns()))


def wait_for_hello(receivers: list[Receiver], timeout_s: float, check: Callable[[], None] | None = None) -> None:
    """Block until each receiver has yielded a Hello (other messages are discarded).

    Raises TimeoutError naming the receivers' endpoints still silent after `timeout_s` s, HandshakeError (at once)
    when a publisher's handshake failed for good (check_handshakes: CURVE on one side only).
    """
    deadline = time.monotonic() + timeout_s
    waiting = list(receivers)
    while waiting:
        check_handshakes(*(r.sock for r in waiting))
        if check is not None:
            check()
        for r in list(waiting):
            if isinstance(r.recv(HELLO_PERIOD_MS), Hello):
                waiting.remove(r)
        if waiting and time.monotonic() > deadline:
            names = [r.sock.getsockopt_string(zmq.LAST_ENDPOINT) for r in waiting]
            raise TimeoutError(f"no Hello within {timeout_s} s on {names}")


def wait_until_subscribed(pub_sock: zmq.Socket, sender: str, ready_receiver: Receiver,
                          expect: set[str], timeout_s: float, check: Callable[[], None] | None = None) -> None:
    """Coordinator side: publish Hellos every ~10 ms until every name in `expect` reports ready.

    Ready reports are Hello messages on `ready_receiver` (a PULL) whose `sender` is the peer's
    name; other messages there are ignored. Raises TimeoutError naming the missing peers, HandshakeError (at once)
    when a peer's handshake with either socket failed for good (check_handshakes: CURVE on one side only).
    `check`, if given, runs every period and may raise to abort (e.g. when a peer process died).
    """
    deadline = time.monotonic() + timeout_s
    missing = set(expect)
    i = 0
    while missing:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{sender}: peers not subscribed within {timeout_s} s: {sorted(missing)}")
        check_handshakes(pub_sock, ready_receiver.sock)
        if check is not None:
            check()
        send(pub_sock, Hello(sender, i, time.perf_counter_ns()))
        i += 1
        slot_end = time.monotonic() + HELLO_PERIOD_MS / 1000
        while missing and (left := slot_end - time.monotonic()) > 0:
            msg = ready_receiver.recv(int(left * 1000))
            if isinstance(msg, Hello):
                missing.discard(msg.sender)
