"""The docs are true: their config examples parse, every config key and command is documented,
and every command line they show uses options that exist."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import msgspec
import yaml

from devplug.cli.main import build_parser
from devplug.config.root import Config
from devplug.fleet import parse_fleet
from devplug.sources import build_plugins, parse_config

ROOT = Path(__file__).resolve().parents[2]


def test_readme_config_example_is_valid() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "example.com/kvm" in b]
    assert blocks
    for block in blocks:
        plugins = build_plugins(parse_config(block, "README.md"))
        assert [p.resource_name for p in plugins] == [
            "example.com/kvm",
            "example.com/serial",
            "example.com/fake",
        ]
        kvm = plugins[0].discover()
        assert [d.id for d in kvm] == [f"kvm::{i}" for i in range(10)]
        assert plugins[0].ids_env == "DEVPLUG_EXAMPLE_COM_KVM"


def test_config_reference_examples_are_valid() -> None:
    text = (ROOT / "docs" / "config.md").read_text()
    blocks = [
        b
        for b in re.findall(r"```yaml\n(.*?)```", text, re.S)
        if "resources:" in b and "apiVersion" not in b  # not the Pod example
    ]
    assert len(blocks) >= 10
    for block in blocks:
        config = parse_config(block, "docs/config.md")
        # A split by the values found at start serves nothing on a host without them.
        raw_split = any(r.split and r.split.models is None for r in config.resources)
        assert build_plugins(config) or raw_split


def test_readme_hardware_example_is_valid() -> None:
    text = (ROOT / "README.md").read_text()
    [block] = [b for b in re.findall(r"```yaml\n(.*?)```", text, re.S) if "split:" in b]
    plugins = build_plugins(parse_config(block, "README.md"))
    assert [p.resource_name for p in plugins] == ["example.com/fpga-u250", "example.com/fpga-u280"]


FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings (code blocks hold none)."""
    seen: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", FENCE.sub("", markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n, anchor = 0, slug
        while anchor in seen:  # a repeated heading gets -1, -2...
            n += 1
            anchor = f"{slug}-{n}"
        seen.add(anchor)
    return seen


def test_relative_links_point_at_files_and_headings_that_exist() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
            elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
                broken.append(f"{page.relative_to(ROOT)}: {target}: no such heading")
    assert len(pages) > 5
    assert not broken, "\n".join(broken)


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
YAML_BLOCK = re.compile(r"```ya?ml\n(.*?)```", re.S)


def test_every_yaml_example_parses_as_a_config_or_kubernetes_objects() -> None:
    configs = 0
    for page in PAGES:
        name = str(page.relative_to(ROOT))
        for block in YAML_BLOCK.findall(page.read_text()):
            if re.search(r"^apiVersion:", block, re.M):
                assert all(doc.get("kind") for doc in yaml.safe_load_all(block)), name
            elif re.search(r"^pools:", block, re.M):  # a fleet file (docs/fleet.md)
                assert parse_fleet(block, name).pools, name
            else:  # anything else shown as YAML is a devplug config, or its top level
                if not re.search(r"^resources:", block, re.M):
                    block += "resources: [{name: example.com/fake, virtual: 1}]\n"
                parse_config(block, name)
                configs += 1
    assert configs >= 20


def schema_keys(tp: msgspec.inspect.Type, at: str = "") -> Iterator[tuple[str, str, object]]:
    """(path, key, default) for every key a config may hold, as written in YAML."""
    if isinstance(tp, msgspec.inspect.StructType):
        for field in tp.fields:
            default = field.default
            if field.default_factory is not msgspec.NODEFAULT:
                default = field.default_factory()
            yield f"{at}.{field.encode_name}", field.encode_name, default
            yield from schema_keys(field.type, f"{at}.{field.encode_name}")
    elif isinstance(tp, msgspec.inspect.ListType):
        yield from schema_keys(tp.item_type, f"{at}[]")
    elif isinstance(tp, msgspec.inspect.DictType):
        yield from schema_keys(tp.value_type, f"{at}{{}}")
    elif isinstance(tp, msgspec.inspect.UnionType):
        for member in tp.types:
            yield from schema_keys(member, at)


def as_written(value: object) -> str | None:
    """A scalar default as the reference writes it (`true`, `10`, `0.1`, `numa`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, int | str) and value != "":
        return str(value)
    return None


def test_every_config_key_is_in_the_reference_with_its_default() -> None:
    keys = list(schema_keys(msgspec.inspect.type_info(Config)))
    rows = [
        line
        for line in (ROOT / "docs" / "config.md").read_text().splitlines()
        if line.startswith("|")
    ]
    missing, wrong = [], []
    for path, key, default in keys:
        mine = [row for row in rows if f"`{key}`" in row]
        if not mine:
            missing.append(path)
        elif (shown := as_written(default)) and not any(f"`{shown}`" in row for row in mine):
            wrong.append(f"{path} (default `{shown}`)")
    assert len(keys) > 60
    assert not missing, f"docs/config.md has no table row for: {', '.join(missing)}"
    assert not wrong, f"docs/config.md does not give the default of: {', '.join(wrong)}"


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def test_every_command_and_option_is_documented() -> None:
    parser = build_parser()
    docs = "\n".join(page.read_text() for page in PAGES)
    missing = [o for o in options(parser) - {"--help"} if o.startswith("--") and o not in docs]
    for name, sub in subcommands(parser).items():
        if f"devplug {name}" not in docs:
            missing.append(f"devplug {name}")
        for option in options(sub) - {"--help"}:
            if option.startswith("--") and not re.search(re.escape(option) + r"(?![\w-])", docs):
                missing.append(f"devplug {name} {option}")
    assert len(subcommands(parser)) >= 10
    assert not missing, f"not in README.md or docs/: {', '.join(missing)}"


# `devplug [global options] COMMAND ...` up to the end of the code span or line.
COMMAND_LINE = re.compile(
    r"\bdevplug((?:\s+--?[\w-]+(?:[ =][^\s`-][^\s`]*)?)*)\s+([a-z][a-z-]+)([^`\n]*)"
)


def test_command_lines_in_the_docs_use_options_that_exist() -> None:
    parser = build_parser()
    commands = subcommands(parser)
    files = [
        *PAGES,
        *sorted((ROOT / "examples").iterdir()),
        *sorted((ROOT / "deploy").rglob("*.yaml")),
    ]
    seen, wrong = 0, []
    for page in files:
        for match in COMMAND_LINE.finditer(page.read_text()):
            before, name, after = match.groups()
            if name not in commands:
                continue
            seen += 1
            sub = commands[name]
            words = after.split()
            if words and words[0] in subcommands(sub):  # devplug pods apply ...
                sub = subcommands(sub)[words[0]]
            known = options(sub) | options(parser)
            for option in re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", f"{before} {after}"):
                if option not in known:
                    wrong.append(f"{page.relative_to(ROOT)}: {option} in {match.group(0).strip()}")
    assert seen > 50
    assert not wrong, "\n".join(wrong)


def test_measurements_are_quoted_only_in_the_readme_table() -> None:
    """docs/ point at the README's Performance table (or `make bench`) rather than quote
    numbers that go stale when the table is measured again."""
    measured = re.compile(r"\b(?:p50|p99|median)\b \d|\d(?: ?ms| µs| calls/s| pods/s)\b")
    quoted = [
        f"{page.relative_to(ROOT)}:{n}: {line.strip()}"
        for page in sorted((ROOT / "docs").glob("*.md"))
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if measured.search(line)
    ]
    assert measured.search((ROOT / "README.md").read_text())
    assert not quoted, "\n".join(quoted)


def test_every_reference_page_is_in_the_index() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    pages = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "README.md"]
    assert len(pages) > 5
    assert not [p for p in pages if f"]({p})" not in index]


def test_make_targets_named_in_the_docs_exist() -> None:
    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))
    named = {
        t
        for page in PAGES
        for t in re.findall(r"(?:`|^)make ([a-z][\w-]*)", page.read_text(), re.M)
    }
    assert {"test", "bench"} <= named
    assert named <= targets, f"no such make target: {', '.join(sorted(named - targets))}"
