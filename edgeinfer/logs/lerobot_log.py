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
Extra channels (the `extra` option, "NAME=FEATURE,..."): any other numeric feature by name, row by row.
Joint names: the state feature's `names` in info.json (a list, or v2.0's {"motors": [...]}: one list under one
key), into ArmLog.joint_names; a URDF's limits are then matched by them (control/urdf_limits.py).
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from edgeinfer.logs.arm_log import ArmLog, LogError
from edgeinfer.logs.fields import joint_names_problem, parse_extra
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


def feature_names(root: Path, info: dict, feature: str) -> list[str] | None:
    """The per-dimension names of `feature` in info.json (features.<feature>.names: a list of strings, or one
    such list under one key, as LeRobot v2.0's {"motors": [...]}), None when it has none. Raises LogError naming
    the field when they cannot name the feature's dimensions (count against its shape, a non-string, a name
    given twice: fields.joint_names_problem)."""
    names = info["features"][feature].get("names")
    if isinstance(names, dict) and len(names) == 1:
        names = next(iter(names.values()))
    if names is None:
        return None
    shape = info["features"][feature].get("shape")
    width = int(np.prod(shape)) if isinstance(shape, list) and shape else len(names) if isinstance(names, list) else 0
    why = joint_names_problem(names, width) if isinstance(names, list) else f"{type(names).__name__}, not a list"
    if why is not None:
        raise LogError(f"{root / 'meta' / 'info.json'}: features.{feature}.names: {why}")
    return list(names)


def _episode_files(root: Path, info: dict, episode: int) -> list[Path]:
    version = str(info["codebase_version"])
    if version.startswith("v2"):
        chunk = episode // int(info.get("chunks_size", 1000))
        return [root / info["data_path"].format(episode_chunk=chunk, episode_index=episode)]
    if version.startswith("v3"):
        return sorted((root / "data").glob("chunk-*/file-*.parquet"))
    raise LogError(f"{root / 'meta' / 'info.json'}: codebase_version {version!r} not supported (v2.x, v3.0)")


def list_lerobot_episodes(path: str | Path) -> list[int]:
    """The episode indices (sorted int) whose frames the data files of the LeRobot dataset at `path` hold: the
    files found, not meta/info.json's totals (a trimmed copy of a dataset keeps the full one's). v2.x: the
    episode index in each file name matching data_path; v3.0: the episode_index column of every data file.
    Raises LogError for an unreadable info.json or data file, an unsupported version, or no episode."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    root = Path(path)
    info = _info(root)
    if str(info["codebase_version"]).startswith("v2"):
        pattern = re.escape(info["data_path"])
        pattern = re.sub(r"\\\{episode_index[^}]*\\\}", r"(?P<episode>\\d+)", pattern)
        pattern = re.sub(r"\\\{[^}]*\\\}", r"\\d+", pattern)
        found = (re.fullmatch(pattern, p.relative_to(root).as_posix()) for p in (root / "data").rglob("*.parquet"))
        episodes = {int(m["episode"]) for m in found if m}
    else:
        episodes = set()
        for file in _episode_files(root, info, 0):  # v3.0: every data file; raises for another version
            try:
                column = pq.read_table(file, columns=["episode_index"])["episode_index"]
            except (OSError, pa.ArrowException) as e:
                raise LogError(f"{file}: unreadable parquet ({type(e).__name__}: {e})") from None
            episodes.update(pc.unique(column).to_pylist())
    if not episodes:
        raise LogError(f"{root}: no episode in its data files ({info['data_path']})")
    return sorted(episodes)


def read_lerobot_log(path: str | Path, episode: int = 0, q_field: str = "observation.state",
                     qd_field: str = "observation.velocity", on_error: OnError = "raise",
                     extra: str | None = None) -> ArmLog:
    """Read episode `episode` of the LeRobot dataset at `path` into an ArmLog (sorted by timestamp).

    extra: "NAME=FEATURE,..." features read into ArmLog.extra (NAME: (T, the feature's width)), row by row.
    ArmLog.joint_names: the state feature's names (feature_names), None when info.json gives none.

    Raises LogError naming the file and the 0-based frame index (frame_index column when present) for an
    unreadable parquet file (missing, truncated: then no frame of that file is usable), a missing column, a
    state of the wrong width or a non-finite value (on_error="truncate" keeps the frames before it), or an
    episode with no frames; for features.<q_field>.names that cannot name its dimensions. LogError names an
    extra feature the dataset lacks (listing its features); ValueError for a malformed `extra`.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = Path(path)
    info = _info(root)
    features = info["features"]
    channels = parse_extra(extra)
    for feature in [q_field, *channels.values()]:
        if feature not in features:
            raise LogError(f"{root / 'meta' / 'info.json'}: no feature {feature!r}; features: {sorted(features)}")
    for name, feature in channels.items():
        if not str(features[feature].get("dtype", "")).startswith(("float", "int", "uint", "bool")):
            raise LogError(f"{root / 'meta' / 'info.json'}: extra channel {name!r}: feature {feature!r} is "
                           f"{features[feature].get('dtype')!r}, not numeric")
    has_qd = qd_field in features
    rec = Records(f"{root} episode {episode}", on_error, unit="frame", joint_names=feature_names(root, info, q_field))
    for file in _episode_files(root, info, episode):
        columns = list(dict.fromkeys(["timestamp", "episode_index", q_field] + ([qd_field] if has_qd else [])
                                     + list(channels.values())))
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
        extras = {name: table[feature].to_pylist() for name, feature in channels.items()}
        for i in range(table.num_rows):
            # float32 seconds -> ns: round to the microsecond the float32 can hold over a few minutes
            if not rec.add(int(round(float(np.float32(t_s[i])) * 1e6)) * 1000, q[i], qd[i],
                           extra={name: v[i] for name, v in extras.items()}):
                break
        if rec.bad_record is not None:
            break
    if len(rec) == 0 and rec.bad_record is None:
        raise LogError(f"{root}: episode {episode} has no frames")
    return rec.to_arm_log(f"{root.name}-episode{episode}", "lerobot")
