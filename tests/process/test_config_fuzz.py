"""The config loader fuzzed: any text, any YAML document, any mix of the schema's own
keys with wrong values gives a valid config or one ConfigError line naming the
source; never another exception. `devplug check` turns the same into exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from devplug.sources import Config, ConfigError, parse_config

SOURCE = "fuzz.yaml"
FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

KEYS = [
    "resources", "limits", "name", "count", "virtual", "groups", "paths", "path",
    "permissions", "containerPath", "mounts", "hostPath", "readOnly", "env", "annotations",
    "cdiDevices", "numaNode", "id", "allowAnyPath", "preferredAllocation", "maxStreams",
    "maxRequestBytes", "maxIdsPerRequest", "maxDevicesPerResource", "registerTimeoutSeconds",
]  # fmt: skip
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True),
    st.text(max_size=30),
    st.sampled_from(
        ["example.com/x", "/dev/null", "/dev/../etc", "/dev/tty*", "rw", "mrw", "", "a/b/c"]
    ),
)
documents = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), inner, max_size=5)
    ),
    max_leaves=25,
)


def outcome(text: str) -> Config | str:
    try:
        return parse_config(text, SOURCE)
    except ConfigError as error:
        message = str(error)
        assert "\n" not in message, message
        assert message.startswith(SOURCE), message
        return message


@FUZZ
@given(text=st.text(max_size=400))
@example("resources: [")
@example("\t")
@example("!!python/object:os.system ls")
@example("a: &x [*x]")
@example("resources: [{name: a.b/c, virtual: 1}]\nlimits: {maxStreams: 0}")
def test_any_text(text: str) -> None:
    outcome(text)


@FUZZ
@given(document=documents)
def test_any_document(document: Any) -> None:
    outcome(yaml.safe_dump(document))


resources = st.fixed_dictionaries(
    {"name": st.sampled_from(["example.com/a", "bad name", "x/" + "y" * 70])},
    optional={
        "virtual": scalars,
        "count": scalars,
        "groups": documents,
        "allowAnyPath": scalars,
    },
)


@FUZZ
@given(
    items=st.lists(resources, max_size=3), limits=st.dictionaries(st.sampled_from(KEYS), scalars)
)
def test_schema_shaped_documents(items: list[dict[str, Any]], limits: dict[str, Any]) -> None:
    document: dict[str, Any] = {"resources": items}
    if limits:
        document["limits"] = limits
    result = outcome(yaml.safe_dump(document))
    if isinstance(result, Config):
        for resource in result.resources:
            assert resource.count >= 1


def test_check_exits_2_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("resources: [{name: example.com/a, virtual: 1}]\nlimits: {maxStreams: -1}\n")
    result = subprocess.run(
        [sys.executable, "-m", "devplug.cli.main", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr == (
        f"{config}: limits.maxStreams: expected a value from 1 to 1024, got -1\n"
    )
