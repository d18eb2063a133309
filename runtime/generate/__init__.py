"""Generation on the host: the engine thread, its slots' sequences, logits processing, sampling, grammars and
detokenising."""
