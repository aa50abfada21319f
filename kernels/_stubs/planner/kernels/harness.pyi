from kernels.harness import *  # noqa: F403
