"""`--policy large`: shipped policies by name, and the runtime settings a manifest recommends for itself (its
"serve" table), applied only where the user left a field at its default."""
import json

import pytest

from edgeinfer.engines.models.paths import DEFAULT_POLICY, LARGE_POLICY, POLICY_NAMES, resolve_policy, serve_defaults
from edgeinfer.node.runtime import RuntimeConfig


def test_names_resolve_to_shipped_manifests_and_paths_stay_paths(tmp_path):
    assert resolve_policy("large") == LARGE_POLICY and resolve_policy("default") == DEFAULT_POLICY
    assert all(p.is_file() for p in POLICY_NAMES.values())
    assert resolve_policy(tmp_path / "mine.json") == tmp_path / "mine.json"
    assert RuntimeConfig(policy="large").policy == LARGE_POLICY


def test_the_large_policy_recommends_its_learned_drafter_on_two_threads():
    assert serve_defaults(LARGE_POLICY) == {"drafter": "learned", "threads": 2}
    assert LARGE_POLICY.with_name("schunk_large_draft.json").is_file()  # the drafter it recommends is shipped
    cfg = RuntimeConfig(policy="large")
    assert (cfg.drafter, cfg.threads) == ("learned", 2)
    cfg = RuntimeConfig(policy="large", drafter="kinematic", threads=1)  # given values win
    assert (cfg.drafter, cfg.threads) == ("kinematic", 1)
    assert RuntimeConfig(policy="large", mode="ultrafast").drafter == "learned"  # the preset takes it as its own
    cfg = RuntimeConfig()  # the default policy recommends nothing
    assert (cfg.drafter, cfg.threads) == ("kinematic", 1)


def test_only_known_fields_of_a_serve_table_apply(tmp_path):
    manifest = tmp_path / "p.json"
    manifest.write_text(json.dumps({"serve": {"threads": 3, "drafter": "learned", "backend": "torch"}}))
    assert serve_defaults(manifest) == {"threads": 3, "drafter": "learned"}
    assert serve_defaults(tmp_path / "missing.json") == {}


@pytest.mark.parametrize("serve, named", [([1, 2], '"serve" must be a table'), ({"threads": -1}, "serve.threads"),
                                          ({"threads": "two"}, "serve.threads"), ({"threads": None}, "serve.threads"),
                                          ({"threads": 1.5}, "serve.threads"), ({"threads": True}, "serve.threads"),
                                          ({"drafter": 3}, "serve.drafter")])
def test_a_bad_serve_table_is_refused_naming_the_file_and_field(tmp_path, serve, named):
    manifest = tmp_path / "p.json"
    manifest.write_text(json.dumps({"serve": serve}))
    with pytest.raises(ValueError, match=f"{tmp_path}.*{named}"):
        RuntimeConfig(policy=manifest)


def test_an_unknown_recommended_drafter_is_named_with_its_source(tmp_path):
    manifest = tmp_path / "p.json"
    manifest.write_text(json.dumps({"serve": {"drafter": "nonexistent"}}))
    with pytest.raises(ValueError, match="got 'nonexistent' \\(the serve table of .*p.json\\)"):
        RuntimeConfig(policy=manifest)
