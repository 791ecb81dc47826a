"""Input processing: an API-neutral prompt + SamplingParams -> the engine's immutable EngineRequest."""
from mindie_service.inputs.limits import InputLimits, fit_prompt
from mindie_service.inputs.processor import InputProcessor, Tokenize, hf_tokenize
from mindie_service.inputs.types import (ChatMessage, ChatPrompt, MediaEncoder, PartsPrompt, Prompt, TextPrompt,
                                         TokensPrompt)
# A chat part still to fetch is the media layer's MediaItem; whoever builds prompts (batch jobs) names it here,
# through the input contract, instead of depending on the media package.
from multimodal import MediaItem

__all__ = ["ChatMessage", "ChatPrompt", "InputLimits", "InputProcessor", "MediaEncoder", "MediaItem", "PartsPrompt",
           "Prompt", "TextPrompt", "Tokenize", "TokensPrompt", "fit_prompt", "hf_tokenize"]
