"""Where the shipped weights live, and where trained ones go: importable without torch (nodes that only read a
manifest, such as the replayer and the control loop, never load torch)."""
import json
from pathlib import Path

WEIGHTS_DIR = Path(__file__).resolve().parents[1] / "weights"
DEFAULT_POLICY = WEIGHTS_DIR / "schunk_target.json"  # the Schunk action-token target's manifest
LARGE_POLICY = WEIGHTS_DIR / "schunk_large_target.json"  # the same data and split, `edgeinfer train --size large`
DCT_POLICY = WEIGHTS_DIR / "schunk_dct_target.json"  # the same data, split and seed, `--tokenizer dct`
DCT_DRAFT = WEIGHTS_DIR / "schunk_dct_draft.json"  # its learned drafter, distilled as schunk_draft
# shipped policies by name: `--policy large` is engines/weights/schunk_large_target.json
POLICY_NAMES = {"default": DEFAULT_POLICY, "large": LARGE_POLICY, "dct": DCT_POLICY}
# runtime settings a manifest's "serve" table may recommend (applied to fields left at their defaults)
SERVE_FIELDS = ("drafter", "threads")
TRAINED_DIR = Path("out") / "policies"  # default folder of `edgeinfer train` / `distill` outputs, under the cwd
MAX_WEIGHTS_MB = 1024.0  # default cap of one policy weights file, MB (the largest shipped one: 12.9 MB)


def trained_policy_path(data: Path | str) -> Path:
    """Where `edgeinfer train` puts a policy trained on `data` by default: out/policies/NAME_target.json, NAME the
    log folder's name, or the log file's name without its suffix (3joint.csv -> 3joint_target.json)."""
    data = Path(data).resolve()
    return TRAINED_DIR / f"{data.name if data.is_dir() else data.stem}_target.json"


def check_writable(out: Path, overwrite_shipped: bool) -> None:
    """Refuse to write a manifest (and its weights) into the package's WEIGHTS_DIR, which holds the shipped
    policies every default run loads, unless `overwrite_shipped` (regenerating them on purpose).
    Raises ValueError naming the path."""
    if not overwrite_shipped and WEIGHTS_DIR in Path(out).resolve().parents:
        raise ValueError(f"--out {out} is in the shipped weights folder {WEIGHTS_DIR}: refusing to overwrite the "
                         "shipped policies; pass --overwrite-shipped to regenerate them on purpose")


def resolve_policy(policy: Path | str) -> Path:
    """A shipped policy's name (POLICY_NAMES: default, large, dct) as its manifest path; any other value as a path."""
    return POLICY_NAMES.get(str(policy), Path(policy))


def serve_defaults(manifest: Path) -> dict:
    """The runtime settings the manifest recommends for itself ({"drafter": "learned", "threads": 2} for the large
    policy: its learned drafter and a pass shared by two threads), SERVE_FIELDS only; {} when it names none or the
    file cannot be read here (the loader reports that, naming the file). Raises ValueError naming the file and the
    field for a "serve" that is not a table, threads outside 1..64 or a drafter that is not a name."""
    import json

    try:
        serve = json.loads(Path(manifest).read_text()).get("serve", {})
    except (OSError, ValueError, AttributeError):
        return {}
    if not isinstance(serve, dict):
        raise ValueError(f"{manifest}: \"serve\" must be a table of {list(SERVE_FIELDS)}, got {serve!r}")
    out = {k: v for k, v in serve.items() if k in SERVE_FIELDS}
    threads = out.get("threads", 1)
    if isinstance(threads, bool) or not isinstance(threads, int) or not 1 <= threads <= 64:
        raise ValueError(f"{manifest}: serve.threads must be an integer in 1..64, got {threads!r}")
    if not isinstance(out.get("drafter", ""), str):
        raise ValueError(f"{manifest}: serve.drafter must be a drafter's name, got {out['drafter']!r}")
    return out


def read_manifest(path: Path | str) -> dict:
    """A policy manifest's JSON object. Raises FileNotFoundError, and ValueError naming the file when it is not a
    JSON object (another file given as --policy: a binary, /etc/passwd, a list)."""
    try:
        manifest = json.loads(Path(path).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a policy manifest ({e})") from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: not a policy manifest (a JSON {type(manifest).__name__}, not an object)")
    return manifest
