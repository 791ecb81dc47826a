"""The engine: scheduler, KV block manager, model runner, sampler, detokenizer, async facade."""
