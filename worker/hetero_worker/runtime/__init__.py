"""A rank's life outside training: launch, rendezvous, preflight checks, shutdown, simulated devices."""
