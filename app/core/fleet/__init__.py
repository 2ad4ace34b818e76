"""The server's devices: one service per device, and where each request goes."""
