"""Request parameters, one rule each: the neutral names (SamplingParams' fields), their ranges, each API
dialect's spelling of them, the output cap and the adapter check. Torch-free; imports only ``errors``, so the
engine, the input processor, the protocol parsers and batch jobs all read the same rules."""
