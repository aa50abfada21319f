from kernels.transfer_ref import *  # noqa: F403
