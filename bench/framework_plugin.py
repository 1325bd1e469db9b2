"""The plugin of `bench/bare.py` written on devplug's framework: the same resource,
the same virtual devices, the IDs in the same env var. `bench/floor.py` runs both.

    python bench/framework_plugin.py PLUGIN_DIR RESOURCE DEVICES
"""

from __future__ import annotations

import sys

from devplug import Device, Plugin, run


class Virtual(Plugin):
    ids_env = "BENCH_IDS"


if __name__ == "__main__":
    plugin_dir, resource, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    devices = [Device(f"dev-{i}") for i in range(count)]
    run(Virtual(resource, devices), plugin_dir=plugin_dir)
