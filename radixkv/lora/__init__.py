"""Many LoRA adapters over one base model, S-LoRA / Punica style.

    adapter.py  a PEFT checkpoint read and checked against the base model (`LoRAAdapter`)
    pool.py     the adapters known (CPU) and the device slots a batch's adapters occupy
    layers.py   `LoRALinear`: a base linear plus each row's own adapter delta; `apply_lora`
    grouped.py  the delta on CPU: rows grouped by adapter, two batched matmuls per linear
    (kernels/lora_sgmv.py: the Triton SGMV kernels; kernels/reference.py: the per-run torch twin)

A batch's rows are grouped in runs of one adapter (segments); each LoRA linear adds
`scaling * (x @ A.T) @ B.T` over each segment with its adapter's A and B (none for the base
model). q/k/v and gate/up are fused in the base model, so their adapters are fused too: A
stacked, B block-diagonal, one product per fused linear.
"""
