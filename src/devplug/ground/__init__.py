"""The ground floor: plumbing every other floor stands on (files written atomically and
owned, trusted and bounded input, unix-socket servers and channels, folder watches,
signals, child processes, lazy exports, optional dependencies, logs and plain output).
It imports nothing else of devplug, so every arrow into it points down."""
