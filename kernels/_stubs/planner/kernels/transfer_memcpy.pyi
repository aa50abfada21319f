from kernels.transfer_memcpy import *  # noqa: F403
