"""Studies on common random numbers: sensitivities by central differences, paired
comparisons, and design on the simulated system."""
