"""The simulated engine: models with declared prices and true costs the server must
measure, for tests and demos without a GPU (an ordinary config choice)."""
