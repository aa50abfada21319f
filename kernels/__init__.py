"""GPU kernels that adapters use to carry out plans (DESIGN.md §5).

Installed as ``planner.kernels`` from the top-level ``kernels/`` folder. One
concept per module; every kernel has a torch reference and runs on CPU
(Triton through its interpreter, ``TRITON_INTERPRET=1``):

- ``layout``: layer-first ⇄ block-first KV cache, per-layer strided views.
- ``paged_attention``: reference decode attention over either layout.
- ``extents``: a rotation plan's ``TransferBatch`` as block ids and byte spans.
- ``transfer_ref`` / ``transfer_naive`` / ``transfer_memcpy`` /
  ``triton_blocks``: block copies (index_copy_ reference, per-segment
  baseline, ``cudaMemcpyBatchAsync``, Triton gather/scatter).
- ``duplex``: both directions of a plan on two streams, with completion events.
- ``pack`` / ``triton_pack``: AQUA's gather of many small tensors into one
  buffer and its inverse scatter.
- ``hybrid_gemm`` / ``triton_gemm``: C2CServe's HybridGEMM.
- ``tiny_model`` / ``harness``: the end-to-end rotation correctness harness.
- the GPU benchmark script is ``planner.bench.kernels_gpu``.

Importing this package needs neither torch nor triton; its modules do.
"""
