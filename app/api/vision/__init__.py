"""Image models' predictions (`/v1/models/{model}/predict`), vramgate's own route."""
