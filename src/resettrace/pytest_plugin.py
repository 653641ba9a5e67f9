"""pytest plugin (entry point ``pytest11``): per-test resettrace statistics."""
