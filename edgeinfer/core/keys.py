"""`edgeinfer keys DIR`: the ZeroMQ CURVE key pairs of a deployment (RFC 26 CurveZMQ, keys from libzmq's
zmq_curve_keypair through pyzmq's zmq.auth), for endpoints that leave the host (edgeinfer.core.transport).

DIR/server.key, DIR/server.key_secret   the pair every bound socket serves with
DIR/client.key, DIR/client.key_secret   the pair every connecting socket authenticates with
DIR/authorized_clients/client.key       public keys the ZAP handler accepts (add one file per extra client)
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import zmq.auth


def make_keys(key_dir: Path) -> dict[str, Path]:
    """Write fresh server and client key pairs under `key_dir` (created; secret files mode 0600).

    Returns {name: path} of what was written. Raises FileExistsError naming the first key file already
    there (keys are never silently replaced: running nodes would stop trusting each other).
    """
    key_dir = Path(key_dir)
    names = ["server.key", "server.key_secret", "client.key", "client.key_secret", "authorized_clients/client.key"]
    for name in names:
        if (key_dir / name).exists():
            raise FileExistsError(f"{key_dir / name}: CURVE key already exists; remove it or pick another directory")
    (key_dir / "authorized_clients").mkdir(parents=True, exist_ok=True)
    for who in ("server", "client"):
        _, secret = zmq.auth.create_certificates(key_dir, who)
        os.chmod(secret, 0o600)
    shutil.copy(key_dir / "client.key", key_dir / "authorized_clients" / "client.key")
    return {name: key_dir / name for name in names}
