"""The engines that run models (torch in-process, llama.cpp in runner processes, the
simulated one for tests) and the table that picks a handler for a model spec. The gate,
routes and tray never ask which engine runs a model."""
