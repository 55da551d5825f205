"""infernetes.kernels: the compute kernels of the runtime.

`infernetes.kernels.ops` is the only module the runtime calls. Each op runs either the Triton
kernel (`triton_backend/`) or its torch reference (`reference/`), chosen by the attention backend
(`infernetes.kernels.backend`). `infernetes.kernels.rope` builds rotary cos/sin caches.
"""
