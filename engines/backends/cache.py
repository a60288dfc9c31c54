"""The engine cache: built plans (ONNX graphs, TensorRT engines) on disk, keyed by everything they depend on.

An entry is a directory `<root>/<key[:16]>/` holding the plan file (and whatever else its builder writes
next to it) and `meta.json`:

    {"key": sha256 hex of the canonical JSON of key_fields, "key_fields": {...}, "plan": file name,
     "plan_sha256": hex, "plan_bytes": int, "build_s": float, "created_unix_s": float}

The key covers the model weights (their sha256), backend, precision, device (name and CUDA compute
capability, or the CPU model), the versions of torch/onnx/onnxscript/onnxruntime/tensorrt and
PLAN_FORMAT, so a change in any of them makes a new entry. An entry is trusted only after its plan's
sha256 matches its meta: the check runs before the plan reaches any deserializer, and a stale or corrupt
entry is rebuilt, never loaded. Builds go to a temporary directory under root that is renamed into place
when complete, so a killed or failed build never leaves a half entry (a killed one leaves a `.<entry>.*`
directory that nothing reads).
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable

PLAN_FORMAT = 1  # bump when an exporter changes what a plan contains (graph signature, layout)
META = "meta.json"

# module -> the pip distributions that provide it (versions read from metadata: nothing is imported)
_LIBRARIES = {
    "torch": ("torch",),
    "onnx": ("onnx",),
    "onnxscript": ("onnxscript",),  # the dynamo exporter's translator: it writes the graph
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"),
    "tensorrt": ("tensorrt", "tensorrt-cu12", "tensorrt-cu13"),
    "modelopt": ("nvidia-modelopt",),  # FP8 Q/DQ placement and calibration of TensorRT plans
}


def default_root() -> Path:
    """$EDGEINFER_CACHE_DIR, else ~/.cache/edgeinfer/engines."""
    env = os.environ.get("EDGEINFER_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "edgeinfer" / "engines"


def _library_version(module: str) -> str | None:
    for dist in _LIBRARIES[module]:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cpu_model() -> str:
    """The CPU's model name: /proc/cpuinfo "model name", else platform.processor() or platform.machine()."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass  # no /proc (macOS, Windows): platform.processor() below
    return platform.processor() or platform.machine()


def device_fields(device: str) -> dict:
    """{"device_name", "compute_capability"} of "cpu" or "cuda[:i]" (capability "major.minor", None on cpu)."""
    if not device.startswith("cuda"):
        return {"device_name": cpu_model(), "compute_capability": None}
    import torch

    index = torch.device(device).index or 0
    major, minor = torch.cuda.get_device_capability(index)
    return {"device_name": torch.cuda.get_device_name(index), "compute_capability": f"{major}.{minor}"}


def engine_key_fields(policy, backend: str, precision: str, device: str) -> dict:
    """Everything a plan of `policy` built for backend/precision/device depends on (JSON-serialisable)."""
    return {
        "plan_format": PLAN_FORMAT,
        "model_sha256": policy.manifest["sha256"],
        "backend": backend,
        "precision": precision,
        "device": "cpu" if not device.startswith("cuda") else device.split(":")[0],
        **device_fields(device),
        "libraries": {module: _library_version(module) for module in _LIBRARIES},
    }


def engine_key(key_fields: dict) -> str:
    """sha256 hex of the canonical JSON (sorted keys, no spaces) of key_fields."""
    blob = json.dumps(key_fields, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class EngineCache:
    """Plans on disk under `root` (default: default_root()); see the module docstring for the layout."""

    def __init__(self, root: Path | str | None = None):
        self.root = Path(root) if root is not None else default_root()

    def get_or_build(self, key_fields: dict, build_fn: Callable[[Path], None], plan_name: str = "plan.onnx",
                     log: Callable[[str], None] = print) -> tuple[Path, dict, bool]:
        """The verified plan for key_fields, building it first if there is no valid entry.

        build_fn(plan_path) must write the plan to plan_path (it may write other files in the same
        directory). Returns (plan_path, meta, built), built True when build_fn ran. A stale (key mismatch)
        or corrupt (unreadable meta, missing plan, size or sha256 mismatch) entry is replaced, with one
        line to `log` saying why. Exceptions from build_fn propagate, leaving no entry behind.
        """
        key = engine_key(key_fields)
        entry = self.root / key[:16]
        if entry.exists():
            meta, problem = _read_entry(entry, key)
            if problem is None:
                return entry / meta["plan"], meta, False
            log(f"engine cache: {problem}; rebuilding")
        plan, meta = self._build(entry, key, key_fields, build_fn, plan_name)
        return plan, meta, True

    def _build(self, entry: Path, key: str, key_fields: dict, build_fn, plan_name: str) -> tuple[Path, dict]:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}.", dir=self.root))
        try:
            t0 = time.perf_counter_ns()
            build_fn(tmp / plan_name)
            build_s = (time.perf_counter_ns() - t0) / 1e9
            meta = {
                "key": key, "key_fields": key_fields, "plan": plan_name,
                "plan_sha256": file_sha256(tmp / plan_name), "plan_bytes": (tmp / plan_name).stat().st_size,
                "build_s": round(build_s, 3), "created_unix_s": time.time(),
            }
            (tmp / META).write_text(json.dumps(meta, indent=2) + "\n")
            if entry.exists():  # the stale or corrupt entry found above
                shutil.rmtree(entry)
            os.replace(tmp, entry)
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
            # another process may have renamed the same build into place between our check and our rename
            meta, problem = _read_entry(entry, key)
            if problem is not None:
                raise
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return entry / meta["plan"], meta


def _read_entry(entry: Path, key: str) -> tuple[dict | None, str | None]:
    """(meta, None) when the entry at `entry` holds a verified plan for `key`, else (None, why not).
    The plan is hashed here, before anything deserializes it."""
    try:
        meta = json.loads((entry / META).read_text())
        plan = entry / meta["plan"]
        expected_sha, expected_bytes = meta["plan_sha256"], meta["plan_bytes"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        return None, f"{entry / META} unreadable ({type(e).__name__}: {e}) (corrupt)"
    if meta.get("key") != key:
        return None, f"{entry / META} key {str(meta.get('key'))[:16]} != {key[:16]} (stale)"
    if not plan.is_file():
        return None, f"{plan} missing (corrupt)"
    if plan.stat().st_size != expected_bytes:
        return None, f"{plan} size {plan.stat().st_size} != {expected_bytes} bytes (corrupt)"
    if file_sha256(plan) != expected_sha:
        return None, f"{plan} sha256 mismatch (corrupt)"
    return meta, None


def plan_summary(plan: Path, meta: dict, built: bool) -> dict:
    """What `edgeinfer build` prints of a cache entry: path, bytes, sha256, build time (s), cached or built now."""
    return {"path": str(plan), "bytes": meta["plan_bytes"], "sha256": meta["plan_sha256"],
            "build_s": meta["build_s"], "cached": not built}
