"""DeepSeek-V4.1-Flash (model_type deepseek_v41): the names a real image build checks
(sfxnz/DeepSeek-V4.1-Flash-EXL3-TensorFold-2x-DGX-Spark docker/Dockerfile asserts MODELS)."""

from ...family import MODEL_TYPE, MODELS, TITLE

MODEL_TYPES = (MODEL_TYPE,)

__all__ = ["MODELS", "MODEL_TYPES", "TITLE"]
