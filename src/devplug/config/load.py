"""Reading a config file: trusted (only root and its owner may change it), bounded,
parsed, its shape checked by msgspec and its meaning by each block's checks; a bad file
gives one `ConfigError` whose message names the file, the field and the problem:
`config.yaml: resources[0].count: expected an integer >= 1, got 0`."""

from __future__ import annotations

import os

from devplug.config.errors import ConfigError, convert
from devplug.config.root import Config, check_config
from devplug.ground import inputs
from devplug.ground.trust import write_problem

DEFAULT_CONFIG = "default.yaml"


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and check a config file; raise ConfigError with a one-line message."""
    source = os.fspath(path)
    check_trusted(source)
    try:
        text = inputs.read_text(source, what="the config")
    except inputs.InputError as e:
        raise ConfigError(str(e)) from None
    return parse_config(text, source)


def check_trusted(path: str | os.PathLike[str]) -> None:
    """ConfigError unless only root and its owner can change the config at `path`: it
    decides which programs devplug runs and what containers get (devplug.ground.trust)."""
    if problem := write_problem(path):
        raise ConfigError(f"{os.fspath(path)}: refused: {problem}")


def load_default_config() -> Config:
    """The config packaged with devplug (virtual resources and /dev/null-style nodes)."""
    beside = os.path.join(os.path.dirname(__file__), DEFAULT_CONFIG)
    try:  # an installed package: a plain file beside this module (no importlib.resources)
        with open(beside, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:  # a zipped package
        from importlib import resources as package_files

        text = package_files.files("devplug.config").joinpath(DEFAULT_CONFIG).read_text("utf-8")
    return parse_config(text, f"<packaged {DEFAULT_CONFIG}>")


def parse_config(text: str, source: str = "<config>") -> Config:
    """Check config text; `source` names it in error messages."""
    try:
        data = inputs.load_yaml(text, source)
    except inputs.InputError as e:
        raise ConfigError(str(e)) from None
    if data is None:
        raise ConfigError(f"{source}: the config is empty: expected a mapping with 'resources'")
    return config_from_data(data, source)


def config_from_data(data: object, source: str) -> Config:
    """Check config data (parsed YAML, or what a front translated from another tool's
    flags and files); `source` names it in error messages."""
    config = convert(data, Config, source)
    check_config(config, source)
    return config
