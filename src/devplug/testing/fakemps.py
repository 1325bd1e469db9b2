"""The name this module had before the fake hardware got a package of its own
(`devplug.fakes.mps`); it stays an alias of that module, and runs it under `-m`."""

import sys

from devplug.fakes import mps as _moved

if __name__ == "__main__":
    sys.exit(_moved.main())
else:
    sys.modules[__name__] = _moved
