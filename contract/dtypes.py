"""The artifact's dtype names and the torch dtypes they stand for."""

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}  # numpy has no bfloat16: rows move as bits
