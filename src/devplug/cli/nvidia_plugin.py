"""`nvidia-device-plugin`: devplug started the way NVIDIA's device plugin is started.

NVIDIA's chart runs the command `nvidia-device-plugin` with its settings in
environment variables (MIG_STRATEGY, PASS_DEVICE_SPECS, DEVICE_LIST_STRATEGY,
CONFIG_FILE, ...) or flags. This command reads them as NVIDIA's plugin does (flags
over variables over the config file) and serves the node's GPUs with `devplug serve`,
so the chart runs devplug with only its image changed.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from devplug.cli import style

# devplug's own keys of the `nvidia:` block, as a JSON object (hostRoot,
# recoverySeconds, ignoredXids...): what NVIDIA's flags cannot say.
OPTIONS_ENV = "DEVPLUG_NVIDIA_OPTIONS"

USAGE = """\
usage: nvidia-device-plugin [--mig-strategy none|single|mixed] [--config-file FILE]
                            [--device-list-strategy LIST] [...NVIDIA's flags]

NVIDIA's device plugin flags and environment variables (MIG_STRATEGY, CONFIG_FILE,
PASS_DEVICE_SPECS, ...), served by devplug. devplug's own keys of the `nvidia:`
block go in DEVPLUG_NVIDIA_OPTIONS as a JSON object. See docs/migrate.md.
"""


def serve_argv(argv: Sequence[str], environ: dict[str, str]) -> list[str]:
    """The `devplug serve` command line that serves what NVIDIA's flags ask for;
    FlagError for a flag or variable NVIDIA's plugin would refuse."""
    from devplug.config.nvidiaflags import resolve

    resolved = resolve(argv, environ)
    words = ["serve", "--plugin-dir", os.path.dirname(resolved.kubelet_socket) or "."]
    if resolved.config_file:
        words += ["--nvidia-config", resolved.config_file]
    # Always set, so that no flag still serves NVIDIA's defaults (not devplug's config).
    words += ["--nvidia-flags", json.dumps(resolved.overrides or {"version": "v1"})]
    if options := environ.get(OPTIONS_ENV, ""):
        words += ["--nvidia-options", options]
    return words


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    if words and words[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return style.EXIT_OK
    from devplug.config.nvidiaflags import FlagError

    try:
        command = serve_argv(words, dict(os.environ))
    except FlagError as error:
        print(f"nvidia-device-plugin: {error}", file=sys.stderr)
        return style.EXIT_USAGE
    from devplug.cli.main import main as devplug

    return devplug(command)


if __name__ == "__main__":
    sys.exit(main())
