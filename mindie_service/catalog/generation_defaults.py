"""vLLM's ``--generation-config`` (ModelConfig.generationConfig): where a model's default sampling parameters come
from. ``vllm``: vLLM's own (nothing here: the routes' defaults); ``auto``: the model folder's
generation_config.json; a folder: that folder's generation_config.json. As vLLM's ``get_diff_sampling_param``:
the file is read by transformers' GenerationConfig, and of what differs from transformers' defaults
(``to_diff_dict``), repetition_penalty, temperature, top_k, top_p, min_p and max_new_tokens become the OpenAI
routes' defaults (a request's own value wins); a folder's max_new_tokens also caps every request's output (vLLM's
``override_max_tokens``). ``auto`` with no file: vLLM's defaults, as in vLLM."""
from __future__ import annotations

import logging
from pathlib import Path

from mindie_service.params.defaults import RequestDefaults

logger = logging.getLogger(__name__)
FILE = "generation_config.json"
SOURCES = ("vllm", "auto")  # or a folder


def generation_defaults(source: str, model_folder: str | Path) -> RequestDefaults:
    """The request defaults ``source`` names for the model in ``model_folder``."""
    if source == "vllm":
        return RequestDefaults()
    folder = Path(model_folder if source == "auto" else source)
    if not (folder / FILE).is_file():
        return RequestDefaults()  # auto without a file (a folder without one is refused when the config loads)
    from transformers import GenerationConfig  # only when asked: a deployment on vLLM's defaults never loads it

    diff = GenerationConfig.from_pretrained(str(folder)).to_diff_dict()
    got = {k: diff.get(k) for k in ("temperature", "top_p", "top_k", "max_new_tokens", "repetition_penalty",
                                    "min_p")}
    out = RequestDefaults.within_rules(temperature=got["temperature"], top_p=got["top_p"], top_k=got["top_k"],
                                       max_tokens=got["max_new_tokens"],
                                       repetition_penalty=got["repetition_penalty"], min_p=got["min_p"])
    if source != "auto" and out.max_tokens is not None:
        out = RequestDefaults(**{**out.__dict__, "max_tokens_cap": out.max_tokens})
    dropped = sorted(k for k, v in got.items() if v is not None and getattr(
        out, "max_tokens" if k == "max_new_tokens" else k) is None)
    if dropped:  # outside the OpenAI routes' ranges (or top_p 1): the route's own default stays
        logger.warning("%s: %s outside the OpenAI routes' ranges, not used as defaults", folder / FILE, dropped)
    logger.info("default sampling parameters from %s: %s", folder / FILE,
                {k: v for k, v in out.__dict__.items() if v is not None})
    return out
