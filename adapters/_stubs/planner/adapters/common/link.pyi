from adapters.common.link import *  # noqa: F403
