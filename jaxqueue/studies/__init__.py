"""Studies built on the simulator and the theory: comparisons and the papers' figures."""
