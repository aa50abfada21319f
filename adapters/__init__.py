"""Engine adapters (installed as planner.adapters): thin code inside vLLM and
SGLang that builds the planner's snapshot, asks for a plan with a tight
deadline and carries it out, falling back to the engine's own policy."""
