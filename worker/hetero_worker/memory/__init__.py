"""Memory: the simulated device's cap, micro-batches and activation checkpointing, Group and Full
sharding and the Trainer's wrapping under them."""
