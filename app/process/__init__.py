"""The server process's plumbing: logging, the console streams of a windowed executable,
whether a port can be listened on."""
