"""Request validation and response encoding for each API family."""
