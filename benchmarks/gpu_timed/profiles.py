"""Named GPUs, models and their calibrations for the GPU-timed engine.

Sources and the fit: docs/benchmarks/gpu_timed.md ("The step model").
Architectures are the models' published ``config.json`` values.
"""

from __future__ import annotations

from benchmarks.gpu_timed.step_model import Calibration, Gpu, Model, StepModel

GPUS = {
    # NVIDIA H100 SXM5 80GB datasheet: 3.35 TB/s HBM3, 989 TFLOPS dense BF16.
    "h100-sxm": Gpu("H100 SXM 80GB", 3.35e12, 989e12),
}

MODELS = {
    "qwen2.5-1.5b": Model("Qwen2.5-1.5B", 1.544e9, layers=28, hidden=1536, heads=12,
                          kv_heads=2, head_dim=128, vocab=151936, tied_embeddings=True),
    "qwen3-8b": Model("Qwen3-8B", 8.191e9, layers=36, hidden=4096, heads=32,
                      kv_heads=8, head_dim=128, vocab=151936, tied_embeddings=False),
    "qwen3-32b": Model("Qwen3-32B", 32.76e9, layers=64, hidden=5120, heads=64,
                       kv_heads=8, head_dim=128, vocab=151936, tied_embeddings=False),
}

#: One calibration for vLLM on the H100 (the page, "The step model"):
#: bandwidth efficiency 0.84 from vLLM 0.6.3's batch-1 speeds of Qwen2.5-1.5B
#: and -7B on one A100 (Qwen's speed benchmark: the two sizes share the
#: per-step overhead and the efficiency); the per-step overhead, 1.9 ms, from
#: Qwen3-8B's batch-1 TPOT on one H100 SXM with vLLM 0.11 (7.28 ms, GPUStack);
#: the tensor-core efficiency 0.6 is not calibrated (no clean published
#: prefill figure; the workloads here prefill little).
H100_VLLM = Calibration(bandwidth_efficiency=0.84, flops_efficiency=0.60, overhead_s=0.0019)

#: (gpu, model) -> calibration.
CALIBRATIONS = {("h100-sxm", m): H100_VLLM for m in MODELS}

#: The profiles a benchmark names: "<gpu>/<model>".
PROFILES = tuple(f"{g}/{m}" for g, m in CALIBRATIONS)


def parse_profile(profile: str) -> tuple[str, str]:
    gpu, _, model = profile.partition("/")
    if (gpu, model) not in CALIBRATIONS:
        raise ValueError(f"no GPU-timed profile {profile!r}; known: {', '.join(PROFILES)}")
    return gpu, model


def step_model_for(gpu: str, model: str) -> StepModel:
    try:
        calibration = CALIBRATIONS[(gpu, model)]
    except KeyError:
        raise ValueError(f"no GPU-timed profile {gpu}/{model}; "
                         f"known: {', '.join(PROFILES)}") from None
    return StepModel(GPUS[gpu], MODELS[model], calibration)
