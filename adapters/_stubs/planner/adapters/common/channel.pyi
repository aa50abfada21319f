from adapters.common.channel import *  # noqa: F403
