"""Test set-up: two CPU devices, so that sharded runs are exercised on any machine."""

import jax

jax.config.update("jax_num_cpu_devices", 2)
