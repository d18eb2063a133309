"""An artifact, loaded as the server loads it, against transformers' float reference."""
