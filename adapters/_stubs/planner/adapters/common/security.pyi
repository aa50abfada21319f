from adapters.common.security import *  # noqa: F403
