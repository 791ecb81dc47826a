"""Engine settings: EngineConfig (engine_config.py) and the feature configs it holds, apart from their features
(spec_config.py: speculative decoding; kv_events_config.py: KV-cache events). Imports no room."""
