"""Planning a run: the layer between the entry points and the simulator.

* :mod:`~jaxqueue.runs.planner`: :func:`~jaxqueue.runs.planner.plan` checks a run's
  arguments and builds its :class:`~jaxqueue.sim.runner.Plan`;
* :mod:`~jaxqueue.runs.estimates`: what a run will cost (time, memory), said before it runs;
* :mod:`~jaxqueue.runs.bounds`: the level bounds, from the mean field;
* :mod:`~jaxqueue.runs.initial`: initial states (empty, the mean field's, an occupancy);
* :mod:`~jaxqueue.runs.transient`: ensemble estimates at given times.

It stands above both the simulator (:mod:`jaxqueue.sim`, which imports no
theory) and the theory (:mod:`jaxqueue.theory`), and below the API and the
studies.
"""
