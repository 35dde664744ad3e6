"""Communication: process groups, the communicator plan, the weighted gradient sync, and the one
collectives module (flatten/reduce/copy back, Gloo through a host copy, wire dtypes)."""
