"""Every file devplug reads is bounded before the work (devplug.ground.inputs): size, nesting
and YAML alias expansion, each refused in one line naming the file, the limit and the
value. Fuzzed over every reader (config, pods, fleet, workload YAML and CSV, NVIDIA's
config, kubeconfig) with shapes, sizes, encodings, byte-order marks, deep nesting and
alias bombs; the commands themselves run under memory and CPU limits."""

from __future__ import annotations

import os
import resource
import subprocess
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim_helpers import cli_command

from devplug.ground import inputs

# A command reading a bad file runs in well under these, whatever the file.
MEMORY_LIMIT = 1536 * 1024 * 1024
CPU_LIMIT_S = 60
# What one reader may allocate for an input of a few KB (counted by tracemalloc).
PEAK_BYTES = 48 * 1024 * 1024


def alias_bomb(levels: int, width: int) -> str:
    """The "billion laughs": each level a list of `width` aliases of the one before."""
    lines = [f"a0: &a0 [{', '.join(['lol'] * width)}]"]
    for k in range(1, levels + 1):
        lines.append(f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def deep(depth: int, flow: bool) -> str:
    if flow:
        return "[" * depth + "]" * depth + "\n"
    return "".join(f"{'  ' * k}k{k}:\n" for k in range(depth)) + "  " * depth + "v\n"


# -- the readers, each with the error it may raise ---------------------------------------------


def _config(text: str) -> object:
    from devplug.config.load import parse_config

    return parse_config(text, "in.yaml")


def _pods(text: str) -> object:
    from devplug.simulator.pods import parse_pods

    return parse_pods(text, "in.yaml")


def _fleet(text: str) -> object:
    from devplug.fleet.spec import parse_fleet

    return parse_fleet(text, "in.yaml")


def _workload_yaml(text: str) -> object:
    from devplug.plan.workload import parse_yaml

    return parse_yaml(text, "in.yaml")


def _workload_csv(text: str) -> object:
    from devplug.plan.workload import parse_csv

    return parse_csv(text, "in.yaml")


def _nvidia(text: str) -> object:
    from devplug.config.nvidiafile import parse

    return parse(text, "in.yaml")


def _errors() -> dict[str, tuple[Callable[[str], object], type[Exception]]]:
    from devplug.config.errors import ConfigError
    from devplug.plan.workload import WorkloadError
    from devplug.simulator import ManifestError

    return {
        "config": (_config, ConfigError),
        "pods": (_pods, ManifestError),
        "fleet": (_fleet, ConfigError),
        "workload YAML": (_workload_yaml, WorkloadError),
        "workload CSV": (_workload_csv, WorkloadError),
        "NVIDIA config": (_nvidia, ConfigError),
    }


READERS = list(_errors())


def read_bounded(reader: str, text: str) -> None:
    """Run one reader on `text`: it returns, or raises its own error in one line naming
    the file; what it allocates stays under PEAK_BYTES."""
    parse, error = _errors()[reader]
    tracemalloc.start()
    try:
        parse(text)
    except error as refused:
        message = str(refused)
        assert "\n" not in message, message
        assert message.startswith("in.yaml"), message
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < PEAK_BYTES, f"{reader}: {peak} bytes for {len(text)} characters"


scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner),
    max_leaves=30,
)
shapes = st.one_of(
    st.text(max_size=300),
    documents.map(lambda d: yaml.safe_dump(d)),
    st.builds(alias_bomb, st.integers(1, 9), st.integers(2, 12)),
    st.builds(deep, st.integers(1, 3000), st.booleans()),
    st.builds(lambda n, w: ("x" * w + ",") * n + "\n", st.integers(1, 200), st.integers(0, 300)),
)


@pytest.mark.parametrize("reader", READERS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=shapes)
def test_every_reader_gives_a_result_or_its_one_line_error_in_bounded_memory(
    reader: str, text: str
) -> None:
    read_bounded(reader, text)


@pytest.mark.parametrize("reader", [r for r in READERS if r != "workload CSV"])
@pytest.mark.parametrize(
    ("text", "said"),
    [
        (alias_bomb(9, 9), "YAML aliases expand it to more than 64 KiB"),
        (deep(5000, True), "nested deeper than 100 mappings and lists"),
        (deep(500, False), "nested deeper than 100 mappings and lists"),
        ("a: &a [*a]\n", "alias *a refers to a node that holds it"),
    ],
    ids=["alias bomb", "deep flow", "deep block", "recursive alias"],
)
def test_each_limit_is_named_in_the_one_line(reader: str, text: str, said: str) -> None:
    parse, error = _errors()[reader]
    with pytest.raises(error) as refused:
        parse(text)
    assert said in str(refused.value)


# -- files: sizes, encodings, byte-order marks -------------------------------------------------


def _load_config(path: Path) -> object:
    from devplug.config.load import load_config

    return load_config(path)


def _load_fleet(path: Path) -> object:
    from devplug.fleet.spec import load_fleet

    return load_fleet(path)


def _load_workload(path: Path) -> object:
    from devplug.plan.workload import load_workload

    return load_workload(str(path))


def _load_kubeconfig(path: Path) -> object:
    from devplug.testing.official import configuration

    return configuration(str(path))


def _load_trace_nodes(path: Path) -> object:
    from devplug.placement.trace import read_nodes

    return read_nodes(str(path))


def _load_trace_pods(path: Path) -> object:
    from devplug.placement.trace import is_pod_list, read_pods

    is_pod_list(str(path))
    return read_pods(str(path))


def _load_gdp_file(path: Path) -> object:
    from devplug.sources.gdpfront import Flags, is_gdp_file, load

    is_gdp_file(str(path))
    return load(Flags(config=str(path)), {})


FILE_READERS: dict[str, tuple[Callable[[Path], object], str]] = {
    "config": (_load_config, ".yaml"),
    "fleet": (_load_fleet, ".yaml"),
    "workload YAML": (_load_workload, ".yaml"),
    "workload CSV": (_load_workload, ".csv"),
    "kubeconfig": (_load_kubeconfig, ""),
    "trace node list": (_load_trace_nodes, ".csv"),
    "trace pod list": (_load_trace_pods, ".csv"),
    "generic device plugin file": (_load_gdp_file, ".yaml"),
}
BOMS = [b"", b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff"]


@pytest.mark.parametrize("reader", FILE_READERS)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    bom=st.sampled_from(BOMS),
    body=st.binary(max_size=200) | shapes.map(str.encode),
)
def test_every_file_reader_takes_any_bytes_in_one_line(
    tmp_path: Path, reader: str, bom: bytes, body: bytes
) -> None:
    from devplug.config.errors import ConfigError
    from devplug.placement.trace import TraceError
    from devplug.plan.workload import WorkloadError

    load, suffix = FILE_READERS[reader]
    path = tmp_path / f"in{suffix}"
    path.write_bytes(bom + body)
    try:
        load(path)
    except (
        ConfigError,
        WorkloadError,
        TraceError,
        ValueError,
    ) as refused:  # kubeconfig: ValueError
        message = str(refused)
        assert "\n" not in message, message
        # (a generic device plugin file without devices: its flag names what is missing)
        assert str(path) in message or message.startswith("--device: "), message


@pytest.mark.parametrize("reader", FILE_READERS)
def test_a_file_over_the_size_limit_is_refused_before_it_is_read(
    tmp_path: Path, reader: str
) -> None:
    """A sparse file of the limit plus one byte: refused on its size, not read."""
    load, suffix = FILE_READERS[reader]
    path = tmp_path / f"big{suffix}"
    small = ("config", "kubeconfig", "generic device plugin file")
    limit = inputs.DEFAULT_LIMITS if reader in small else inputs.LARGE_LIMITS
    with path.open("wb") as f:
        f.truncate(limit.max_bytes + 1)
    with pytest.raises((ValueError, Exception), match="the limit is") as refused:
        load(path)
    assert f"{path}" in str(refused.value)
    assert f"the limit is {limit.max_bytes // 2**20}.0 MiB ({limit.max_bytes} bytes)" in str(
        refused.value
    )


def test_a_bom_is_dropped_and_invalid_utf8_is_named_with_its_byte(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_bytes(b"\xef\xbb\xbfresources:\n  - name: example.com/x\n    virtual: 1\n")
    assert _load_config(path) is not None
    path.write_bytes(b"resources: \xff\n")
    with pytest.raises(Exception, match=r"not UTF-8 text \(byte 12\)"):
        _load_config(path)


# -- the commands, under memory and CPU limits ------------------------------------------------


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_LIMIT_S, CPU_LIMIT_S))


FLEET = (
    "pools:\n  - name: p\n    count: 1\n    cpu: 8\n    memory: 8Gi\n"
    "    config: {resources: [{name: example.com/x, virtual: 1}]}\n"
)


def commands(tmp: Path, bad: Path) -> dict[str, list[str]]:
    fleet = tmp / "fleet.yaml"
    fleet.write_text(FLEET)
    return {
        "check": ["check", "--config", str(bad)],
        "pods apply": ["pods", "apply", "-f", str(bad), "--control", str(tmp / "none.sock")],
        "fleet check": ["fleet", "check", "-f", str(bad)],
        "plan": ["plan", "-f", str(fleet), "--workload", str(bad)],
        "serve --nvidia-config": [
            "serve", "--nvidia-config", str(bad), "--plugin-dir", str(tmp / "plugins"),
        ],
    }  # fmt: skip


BAD_FILES = {
    "alias bomb": (alias_bomb(9, 9), "YAML aliases expand it to more than"),
    # The 413-byte file once stored as a 7.9 MB line.
    "small alias bomb": (alias_bomb(5, 9)[:413], "YAML aliases expand it to more than"),
    "deep nesting": (deep(100_000, True), "nested deeper than 100"),
}


@pytest.mark.parametrize("bad", BAD_FILES)
@pytest.mark.parametrize(
    "command", ["check", "pods apply", "fleet check", "plan", "serve --nvidia-config"]
)
def test_each_command_refuses_a_hostile_file_in_one_line_within_its_limits(
    tmp_path: Path, command: str, bad: str
) -> None:
    text, said = BAD_FILES[bad]
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    done = subprocess.run(
        cli_command(*commands(tmp_path, path)[command]),
        capture_output=True,
        text=True,
        timeout=CPU_LIMIT_S * 3,
        preexec_fn=_limits,
        env=dict(os.environ),
        check=False,
    )
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    [line] = done.stderr.splitlines()
    assert str(path) in line, line
    assert said in line, line


def test_the_alias_limit_leaves_ordinary_anchors_alone() -> None:
    """Thirty resources sharing one env block of 20 variables through an anchor."""
    shared = {f"VAR_{k}": "x" * 40 for k in range(20)}
    text = "env: &env " + yaml.safe_dump(shared, default_flow_style=True) + "resources:\n"
    text += "".join(f"  - {{name: example.com/r{k}, env: *env}}\n" for k in range(30))
    data = inputs.load_yaml(text, "in.yaml")
    assert len(data["resources"]) == 30
    assert data["resources"][29]["env"] == shared
