"""NVIDIA Triton Inference Server as the shared model tier: a model repository made from local models."""
