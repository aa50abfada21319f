from kernels.triton_pack import *  # noqa: F403
