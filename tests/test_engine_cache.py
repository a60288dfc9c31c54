"""The engine cache builds once, hits after, and rebuilds (never loads) a stale or corrupt entry."""
import json

import pytest

from edgeinfer.engines.backends.cache import EngineCache, engine_key, engine_key_fields

PLAN = b"plan bytes " * 100


class Builder:
    """build_fn that writes PLAN and counts its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, plan_path):
        self.calls += 1
        plan_path.write_bytes(PLAN)


@pytest.fixture
def fields(policy):
    return engine_key_fields(policy, "onnxruntime", "fp32", "cpu")


def test_key_fields_cover_model_device_and_libraries(policy, fields):
    assert fields["model_sha256"] == policy.manifest["sha256"]
    assert fields["device"] == "cpu" and fields["device_name"] and fields["compute_capability"] is None
    assert {"torch", "onnx", "onnxscript", "onnxruntime", "tensorrt"} <= set(fields["libraries"])
    assert fields["libraries"]["torch"]
    other = engine_key_fields(policy, "onnxruntime", "bf16", "cpu")
    assert engine_key(other) != engine_key(fields)
    assert engine_key(json.loads(json.dumps(fields))) == engine_key(fields)


def test_first_build_builds_then_hits(tmp_path, fields):
    cache, build, lines = EngineCache(tmp_path), Builder(), []
    plan, meta, built = cache.get_or_build(fields, build, log=lines.append)
    assert built and build.calls == 1 and plan.read_bytes() == PLAN
    assert plan.parent == tmp_path / engine_key(fields)[:16]
    assert meta["plan_bytes"] == len(PLAN) and meta["key_fields"] == fields and meta["build_s"] >= 0
    again, meta_again, built_again = cache.get_or_build(fields, build, log=lines.append)
    assert (again, meta_again, built_again) == (plan, meta, False)
    assert build.calls == 1 and lines == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [plan.parent.name]  # no temp dirs left


def test_default_root_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEINFER_CACHE_DIR", str(tmp_path / "engines"))
    assert EngineCache().root == tmp_path / "engines"


def test_corrupt_plan_is_rebuilt_not_loaded(tmp_path, fields):
    cache, build, lines = EngineCache(tmp_path), Builder(), []
    plan, _, _ = cache.get_or_build(fields, build)
    blob = bytearray(plan.read_bytes())
    blob[10:14] = bytes(b ^ 0xFF for b in blob[10:14])  # same size, different content
    plan.write_bytes(bytes(blob))
    again, _, built = cache.get_or_build(fields, build, log=lines.append)
    assert built and build.calls == 2 and again.read_bytes() == PLAN
    assert lines == [f"engine cache: {plan} sha256 mismatch (corrupt); rebuilding"]


@pytest.mark.parametrize("damage", ["missing plan", "truncated plan", "unreadable meta"])
def test_damaged_entry_is_rebuilt(tmp_path, fields, damage):
    cache, build, lines = EngineCache(tmp_path), Builder(), []
    plan, _, _ = cache.get_or_build(fields, build)
    if damage == "missing plan":
        plan.unlink()
    elif damage == "truncated plan":
        plan.write_bytes(PLAN[:-1])
    else:
        (plan.parent / "meta.json").write_text("{not json")
    _, _, built = cache.get_or_build(fields, build, log=lines.append)
    assert built and build.calls == 2 and plan.read_bytes() == PLAN
    assert len(lines) == 1 and "(corrupt); rebuilding" in lines[0]


def test_stale_key_is_rebuilt(tmp_path, fields):
    cache, build, lines = EngineCache(tmp_path), Builder(), []
    plan, _, _ = cache.get_or_build(fields, build)
    meta_path = plan.parent / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["key"] = "0" * 64
    meta_path.write_text(json.dumps(meta))
    _, meta_new, built = cache.get_or_build(fields, build, log=lines.append)
    assert built and build.calls == 2 and meta_new["key"] == engine_key(fields)
    assert len(lines) == 1 and "(stale); rebuilding" in lines[0]


def test_failed_build_leaves_no_entry(tmp_path, fields):
    cache = EngineCache(tmp_path)

    def build(plan_path):
        plan_path.write_bytes(PLAN[:5])  # a half-written plan, then the build dies
        raise RuntimeError("exporter crashed")

    with pytest.raises(RuntimeError, match="exporter crashed"):
        cache.get_or_build(fields, build)
    assert list(tmp_path.iterdir()) == []
    _, _, built = cache.get_or_build(fields, Builder())
    assert built
