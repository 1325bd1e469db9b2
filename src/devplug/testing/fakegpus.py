"""The name this module had before the fake hardware got a package of its own
(`devplug.fakes.gpus`); it stays an alias of that module, state and all."""

import sys

from devplug.fakes import gpus as _moved

sys.modules[__name__] = _moved
