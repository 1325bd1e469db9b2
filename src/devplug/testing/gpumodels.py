"""The name this module had before the fake hardware got a package of its own
(`devplug.fakes.gpumodels`); it stays an alias of that module, state and all."""

import sys

from devplug.fakes import gpumodels as _moved

sys.modules[__name__] = _moved
