"""What the build (gemma4_port) and the server (runtime) must agree on: the artifact format and its
geometry, the host inputs the graphs take, dtypes, SDK versions, the tokenizer check, the Neuron
graph layouts and signatures, and the rank-group primitive. It imports neither of them."""
