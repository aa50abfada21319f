from adapters.common import *  # noqa: F403
