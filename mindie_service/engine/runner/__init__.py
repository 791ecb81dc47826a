"""Running the model: the model runner (model_runner.py), everything an engine loads before its first step
(engine_parts.py: device, weights, tokenizer, KV pool size), and tensor parallelism (parallel/)."""
