"""Reading a policy folder's files safely: paths kept inside the manifest's folder, weights read once, capped,
hashed and loaded from the same bytes.

A manifest comes with its folder, which may not be the user's own: a name in it must not reach outside the folder
(`../`, an absolute path, a symlink out of it), and a weights file must neither exhaust memory (`/dev/zero`, a
file that grows while read) nor change between the sha256 check and the load (so the bytes hashed are the bytes
loaded: one read, no second open). Nothing is unpickled: torch.load(weights_only=True), or safetensors.
"""
from __future__ import annotations

import hashlib
import io
import os
import stat
from pathlib import Path

import torch

from edgeinfer.engines.models.paths import MAX_WEIGHTS_MB

_CHUNK = 1 << 20  # read size, bytes


def inside(folder: Path, name: str, what: str) -> Path:
    """The path `name` names relative to `folder`, symlinks resolved. `what` names the manifest field in errors.
    Raises ValueError for a name that is not a non-empty relative path, has a `..` part, or resolves outside
    folder (a symlink out of it)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what}: expected a file name relative to {folder}, got {name!r}")
    rel = Path(name)
    if rel.is_absolute() or rel.drive or ".." in rel.parts:
        raise ValueError(f"{what}: {name!r} must be a path inside the manifest's folder {folder} (no absolute "
                         f"path, no '..')")
    root = Path(folder).resolve()
    path = (root / rel).resolve()
    if root not in path.parents:
        raise ValueError(f"{what}: {name!r} resolves to {path}, outside the manifest's folder {root} (a symlink "
                         f"out of it)")
    return path


def read_checked(path: Path, sha256: str | None, max_mb: float = MAX_WEIGHTS_MB) -> bytes:
    """The bytes of the regular file `path`, read once in chunks, at most max_mb MB, whose sha256 is `sha256`.
    Raises FileNotFoundError for a missing file, ValueError naming the file for one that is not a regular file
    (a device, a FIFO), larger than max_mb on stat or while read, or whose sha256 is missing or differs."""
    limit = int(max_mb * 1e6)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO must not block the open
    with os.fdopen(fd, "rb", buffering=0) as f:
        st = os.fstat(f.fileno())  # of the file opened: no swap between this check and the read
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: not a regular file (weights must be a file, not a device or a pipe)")
        if st.st_size > limit:
            raise ValueError(f"{path}: {st.st_size / 1e6:.1f} MB, over the weights cap of {max_mb:g} MB "
                             "(RuntimeConfig.max_policy_weights_mb)")
        digest, data = hashlib.sha256(), bytearray()
        while chunk := f.read(_CHUNK):
            if len(data) + len(chunk) > limit:  # it grew after the stat
                raise ValueError(f"{path}: over the weights cap of {max_mb:g} MB while read "
                                 "(RuntimeConfig.max_policy_weights_mb)")
            digest.update(chunk)
            data += chunk
    if sha256 != digest.hexdigest():
        raise ValueError(f"{path}: sha256 {digest.hexdigest()} does not match the manifest's {sha256}")
    return bytes(data)


def load_state_dict(path: Path, sha256: str | None, max_mb: float = MAX_WEIGHTS_MB) -> dict:
    """A state dict {name: tensor} from `path`, checked by read_checked and loaded from the bytes it hashed:
    safetensors for .safetensors, else torch.load(weights_only=True). Raises as read_checked, ImportError for
    .safetensors without the safetensors package."""
    data = read_checked(path, sha256, max_mb)
    if Path(path).suffix == ".safetensors":
        try:
            from safetensors.torch import load as load_safetensors
        except ImportError:
            raise ImportError(f"{path}: .safetensors weights need the safetensors package (pip install "
                              "safetensors), or save them with torch.save as .pt") from None
        return load_safetensors(data)
    return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
