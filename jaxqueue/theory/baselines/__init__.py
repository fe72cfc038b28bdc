"""Baselines beside the mean field: Erlang C (the pooled queue), Lu et al.'s
approximation of JIQ, and the Halfin-Whitt diffusion limit."""
