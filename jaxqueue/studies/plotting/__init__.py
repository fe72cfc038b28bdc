"""Figures of grid experiments: figure specs, the lines drawn from a store, their
labels, axes and fits, and the baselines drawn beside them."""
