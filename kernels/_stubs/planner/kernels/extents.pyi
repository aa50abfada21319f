from kernels.extents import *  # noqa: F403
