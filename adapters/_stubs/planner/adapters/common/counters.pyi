from adapters.common.counters import *  # noqa: F403
