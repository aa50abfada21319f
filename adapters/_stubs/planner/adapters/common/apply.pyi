from adapters.common.apply import *  # noqa: F403
