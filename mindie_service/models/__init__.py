"""Model code: the Llama family over the paged cache, multimodal encoders, the checkpoint loader and quantized loading (demo checkpoints are built by mindie_service.devkit)."""
