"""CPU stand-in for the part of neuronx-distributed 0.17.26814 (SDK 2.28) that this project calls:
ModelBuilder (trace, shard_checkpoint), the traced NxD model (nxd_model.forward / initialize /
state), parallel_state and the two parallel linears. Each behaviour names the file of
aws-neuron/neuronx-distributed at tag v2.28.0 it follows; what the source does not settle raises."""
