"""`python -m devplug`: the `devplug` command, where only the interpreter is on PATH
(a venv not activated, a container without the entry-point script)."""

from __future__ import annotations

import sys

from devplug.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
