"""A rank's life outside training: launch, rendezvous, preflight checks, shutdown, simulated devices,
the rank log line (ranklog) and the argument checks every floor shares (checks)."""
