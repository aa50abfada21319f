from kernels.transfer_batch import *  # noqa: F403
