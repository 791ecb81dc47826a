"""The model catalog: models on disk and in config.json, their states and engines (Jan's model routes)."""
