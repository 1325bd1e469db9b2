"""The `devplug` command: one module per sub-command, each with `configure` and `run`."""
