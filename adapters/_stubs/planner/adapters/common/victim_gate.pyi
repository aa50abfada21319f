from adapters.common.victim_gate import *  # noqa: F403
