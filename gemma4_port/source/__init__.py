"""Where a model comes from: the manifest that names it, its checkpoint (downloaded, or random and written as a
real folder), its config, and the toy tokenizer of the test models."""
