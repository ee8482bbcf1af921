"""Control plane: resource state, reconcile steps and the embedded host that runs them."""
