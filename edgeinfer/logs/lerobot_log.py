"""LeRobot datasets (one episode) through pyarrow: parquet frames plus meta/info.json.

Layouts (LeRobot's `codebase_version`):
    v2.x  data_path "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet", one file per episode,
          episode_chunk = episode_index // chunks_size.
    v3.0  data_path "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet", many episodes per file; the
          episode's rows are those with its episode_index (meta/episodes/ says which file; we scan the data
          files in order, which needs no episode metadata).
Columns: `timestamp` (float32 s from episode start), the state column (default observation.state, a
fixed-size list per frame) and optionally a velocity column (default observation.velocity; when absent, qd
is a finite difference of q). LeRobot stores features as float32, so values round-trip at float32 precision.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from edgeinfer.logs.arm_log import ArmLog, LogError
from edgeinfer.logs.samples import OnError, Records


def _info(root: Path) -> dict:
    info_path = root / "meta" / "info.json"
    try:
        info = json.loads(info_path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise LogError(f"{info_path}: {e}") from None
    for key in ("codebase_version", "data_path", "fps", "features"):
        if key not in info:
            raise LogError(f"{info_path}: no {key!r}")
    return info


def _episode_files(root: Path, info: dict, episode: int) -> list[Path]:
    version = str(info["codebase_version"])
    if version.startswith("v2"):
        chunk = episode // int(info.get("chunks_size", 1000))
        return [root / info["data_path"].format(episode_chunk=chunk, episode_index=episode)]
    if version.startswith("v3"):
        return sorted((root / "data").glob("chunk-*/file-*.parquet"))
    raise LogError(f"{root / 'meta' / 'info.json'}: codebase_version {version!r} not supported (v2.x, v3.0)")


def read_lerobot_log(path: str | Path, episode: int = 0, q_field: str = "observation.state",
                     qd_field: str = "observation.velocity", on_error: OnError = "raise") -> ArmLog:
    """Read episode `episode` of the LeRobot dataset at `path` into an ArmLog (sorted by timestamp).

    Raises LogError naming the file and the 0-based frame index (frame_index column when present) for an
    unreadable parquet file (missing, truncated: then no frame of that file is usable), a missing column, a
    state of the wrong width or a non-finite value (on_error="truncate" keeps the frames before it), or an
    episode with no frames.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(path)
    info = _info(root)
    features = info["features"]
    if q_field not in features:
        raise LogError(f"{root / 'meta' / 'info.json'}: no feature {q_field!r}; features: {sorted(features)}")
    has_qd = qd_field in features
    rec = Records(f"{root} episode {episode}", on_error, unit="frame")
    for file in _episode_files(root, info, episode):
        columns = ["timestamp", "episode_index", q_field] + ([qd_field] if has_qd else [])
        try:
            table = pq.read_table(file, columns=columns)
        except (OSError, pa.ArrowException) as e:
            rec.where = f"{file} episode {episode}"
            rec.fail(len(rec), f"unreadable parquet ({type(e).__name__}: {e})")
            break
        table = table.filter(pa.compute.equal(table["episode_index"], episode))
        if table.num_rows == 0:
            continue
        rec.where = f"{file} episode {episode}"
        t_s = table["timestamp"].to_numpy().astype(np.float64)
        q = table[q_field].to_pylist()
        qd = table[qd_field].to_pylist() if has_qd else [None] * len(q)
        for i in range(table.num_rows):
            # float32 seconds -> ns: round to the microsecond the float32 can hold over a few minutes
            if not rec.add(int(round(float(np.float32(t_s[i])) * 1e6)) * 1000, q[i], qd[i]):
                break
        if rec.bad_record is not None:
            break
    if len(rec) == 0 and rec.bad_record is None:
        raise LogError(f"{root}: episode {episode} has no frames")
    return rec.to_arm_log(f"{root.name}-episode{episode}", "lerobot")
