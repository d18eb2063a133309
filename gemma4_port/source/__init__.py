"""Where a model comes from: the manifest that names it (its model sources, variants and toolchain), its
checkpoint (downloaded, or random and written as a real folder), its config, and the toy tokenizer of the test
models."""
