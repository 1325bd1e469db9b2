"""The name this module had before the fake hardware got a package of its own
(`devplug.fakes.nvml`); it stays an alias of that module, state and all."""

import sys

from devplug.fakes import nvml as _moved

sys.modules[__name__] = _moved
