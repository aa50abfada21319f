from kernels.duplex import *  # noqa: F403
