"""Pure admission: the memory gate, the book of learned prices, group and batch planning.
No torch, no FastAPI, no callbacks into the core; the clock is injected."""
