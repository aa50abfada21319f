from kernels.layout import *  # noqa: F403
