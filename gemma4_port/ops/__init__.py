"""Operating a build host: `plan` (does a variant fit) and `doctor` (is this inf2 machine ready)."""
