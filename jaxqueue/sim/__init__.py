"""The lockstep uniformized simulator.

* :mod:`~jaxqueue.sim.state`: a replica's Markov state and running sums;
* :mod:`~jaxqueue.sim.step`: one step of the occupancy-tail state (one replica's
  arrays or a tile's per-level vectors);
* :mod:`~jaxqueue.sim.per_server`: one step of the per-server state (JIQ-Original, JIQ-Threshold);
* :mod:`~jaxqueue.sim.events`: the step record both produce;
* :mod:`~jaxqueue.sim.blocks`: blocks of steps for a batch of replicas, jit and sharding;
* :mod:`~jaxqueue.sim.registers`: the register layout (tiles of replicas level by level);
* :mod:`~jaxqueue.sim.kernel`: the register layout as a Pallas GPU kernel;
* :mod:`~jaxqueue.sim.windows`: each load's warm-up, measured window and batches;
* :mod:`~jaxqueue.sim.runner`: a plan's run: initial state, advance, checkpoint, collect;
* :mod:`~jaxqueue.sim.transient`: ensemble estimates at given times.

The simulator imports no theory: the level bounds and the mean-field start
of a run come from :mod:`jaxqueue.runs`, which plans it.
"""
