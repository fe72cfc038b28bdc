"""The generic mean field: its two models (identical exponential servers, and server
classes of phase-type service and pools), the solver core, and their fixed points and
transients."""
