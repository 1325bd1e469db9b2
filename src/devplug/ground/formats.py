"""Results as machines read them: a JSON object on one line, or a YAML document.

The commands' `-o json` and `-o yaml` (see devplug.cli.style) and the demo's event
stream print through here, so every command writes them the same way."""

from __future__ import annotations

from typing import Any

import msgspec

MACHINE_FORMATS = ("json", "yaml")


def render(result: Any, output: str) -> str:
    """`result` (plain data, msgspec structs or dataclasses) as one JSON line (`json`)
    or one YAML document opening with `---` (`yaml`), with its final newline."""
    if output == "json":
        return msgspec.json.encode(result, enc_hook=str).decode() + "\n"
    if output == "yaml":
        import yaml

        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        data = msgspec.to_builtins(result, enc_hook=str)
        text: str = yaml.dump(
            data, Dumper=dumper, sort_keys=False, explicit_start=True, allow_unicode=True
        )
        return text
    raise ValueError(f"unknown output format {output!r}: one of {', '.join(MACHINE_FORMATS)}")
