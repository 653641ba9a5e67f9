"""The reference reset path, resettrace's second product: batched MuJoCo and MotrixSim
backends under one contract (:mod:`~resettrace.sim.contract`), the G1 walk-flat and
motion-tracking tasks, domain randomization, numba kernels and the bundled G1.

It needs the ``sim`` extra (``pip install 'resettrace[sim]'``) and instruments itself
through the tracer's public API only, as a user's env does; the tracer never imports it
(``resettrace.make_env`` and ``make_backend`` load it when called; a test checks the
rule). The benchmarks (:mod:`resettrace.bench`) run on it.
"""
