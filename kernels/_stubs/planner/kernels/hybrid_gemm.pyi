from kernels.hybrid_gemm import *  # noqa: F403
