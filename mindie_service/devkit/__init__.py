"""Development kit: what the project builds for itself instead of downloading (demo models, corpus,
demo LoRA adapters, synthetic media, dev certificates) and the StandardMock engine.

Modules, imported one by one (this package imports nothing, so reaching for the certificates does not
pull in torch, nor the synthetic media PyAV):

``presets``      the one preset table (tiny, small, tiny-vl, tiny-audio), ``build_demo_model``, build versions
``text_model``   random-weight Llama checkpoints + the locally trained tokenizer
``mm_model``     the multimodal checkpoints (LLaVA, Qwen2-Audio) on the tiny text backbone
``corpus``       the deterministic tokenizer training corpus
``lora``         random PEFT adapters for a base checkpoint (``build_demo_lora``)
``synth``        small synthetic images, videos and audio for tests and benchmarks
``certs``        a development CA with server and client certificates (``generate_dev_certs``)
"""
