"""Models' lives on a device: the registry of handlers, loading and unloading, keep-alive,
memory given back to other programs."""
