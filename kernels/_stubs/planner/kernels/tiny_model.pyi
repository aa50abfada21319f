from kernels.tiny_model import *  # noqa: F403
