"""Input processing: an API-neutral prompt + SamplingParams -> the engine's immutable EngineRequest."""
from mindie_service.inputs.limits import InputLimits, fit_prompt
from mindie_service.inputs.processor import InputProcessor, Tokenize, hf_tokenize
from mindie_service.inputs.types import (ChatMessage, ChatPrompt, MediaEncoder, PartsPrompt, Prompt, TextPrompt,
                                         TokensPrompt)

__all__ = ["ChatMessage", "ChatPrompt", "InputLimits", "InputProcessor", "MediaEncoder", "PartsPrompt", "Prompt",
           "TextPrompt", "Tokenize", "TokensPrompt", "fit_prompt", "hf_tokenize"]
