"""The lab's experiments: each module with a ``main()`` is one, run from the repository root as
``python -m benchmarks <name> [args...]`` (``python -m benchmarks list`` names them all); the modules
without one (``servers``, ``load``, ``live_fronts``, ``fidelity_data``) hold what several share. They
may import any package of the project; none imports them."""
