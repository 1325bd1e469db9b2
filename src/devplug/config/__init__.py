"""The config file of the config-driven plugins: its schema, one module per block, and
the device-ID rules, low in the house so that the framework shares them. Nothing here
imports the runtime (no gRPC, no framework, no device source): a config is checked on
any host, and `devplug.sources` builds plugins from it.

Importing this package imports nothing; `devplug.config.load` reads a file.
"""
