"""Whether the device and its work are well: readiness and the watchdog
(`readiness`), the warm-up and the readiness probe, real requests through the normal path
(`exercise`), and a driver spilling into system RAM (`spill`)."""
