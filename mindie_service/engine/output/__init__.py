"""From a token to an event: incremental detokenization (detokenizer.py), output processing (output_processor.py)
and the one stop rule (stop_rule.py)."""
