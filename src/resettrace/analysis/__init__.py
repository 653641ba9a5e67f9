"""Offline analysis of run records (:mod:`resettrace.record`), apart from the runtime core:

- :mod:`~resettrace.analysis.compare`: ``resettrace compare BASE NEW``, per-key verdicts;
- :mod:`~resettrace.analysis.report`: ``resettrace report RUN``, one HTML file;
- :mod:`~resettrace.analysis.fit`: ``resettrace fit RUN...``, the cost model of each phase;
- :mod:`~resettrace.analysis.job_lines`: the text tables they share (and ``resettrace
  merge``'s, whose rules are :mod:`resettrace.merging`'s).

Each reads any run record: a collector ``timing.json`` (also one written before records
had a format), a ``resettrace run`` job or process record, ``resettrace.write_run``'s, the
pytest plugin's; the phase tree is the record's own (registered phases included).
"""
