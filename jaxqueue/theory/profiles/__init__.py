"""The mean field under a periodic arrival-rate profile: the periodic regime of either
model's ODE, its compiled passes and its results."""
