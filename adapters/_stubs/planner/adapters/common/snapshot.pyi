from adapters.common.snapshot import *  # noqa: F403
