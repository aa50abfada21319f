from kernels.triton_gemm import *  # noqa: F403
