"""A chat model's answer as its family writes it: its thinking apart from its text."""
