from adapters.common.offload_link import *  # noqa: F403
