"""The Gemma-4 decoder as a device graph (static shapes and KV, host-side embeddings), its traceable graphs, its
tensor-parallel sharding rules and the graph lint."""
