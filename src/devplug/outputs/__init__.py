"""Files derived from the published devices of any plugin (CDI specs, node feature
files), written atomically so that readers never see half a file."""
