"""Engine-neutral adapter pieces: the planner link with deadline and
fallback, its counters, the snapshot builder and plan application."""
