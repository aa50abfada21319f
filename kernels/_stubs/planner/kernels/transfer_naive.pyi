from kernels.transfer_naive import *  # noqa: F403
