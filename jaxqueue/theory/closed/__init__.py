"""The closed forms: the ``p0`` equation of JIQ-Pod(d), the tails and response times a
policy declares, and the inverse design on them (JAX, differentiable)."""
