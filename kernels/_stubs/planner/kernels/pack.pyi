from kernels.pack import *  # noqa: F403
