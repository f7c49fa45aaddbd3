# Experiment arm: the attention's reference paths (SDPA on CUDA), not the Triton kernel.
from streamd.model.attention import RelPositionMultiHeadAttention as _A
_A.kernel = False
