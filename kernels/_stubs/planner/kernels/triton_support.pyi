from kernels.triton_support import *  # noqa: F403
