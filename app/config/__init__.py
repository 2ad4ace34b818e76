"""Configuration: the one frozen Settings object (defaults < config file < VRAMGATE_* env
< CLI flags), the models it names, durations as people write them, the bearer token."""
