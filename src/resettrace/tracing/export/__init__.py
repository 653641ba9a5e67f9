"""Span export: the training process packs records into a pipe, the export process writes
every format from them.

- :mod:`.protocol`: the pipe's frames, one table both ends use;
- :mod:`.parent`: :class:`~.parent.ProcessExporter`, the training process's sink;
- :mod:`.child`: the export process (``python -m resettrace.tracing.export.child``);
- :mod:`.records`: traces as records with their ids, batches, per-shape text templates;
- :mod:`.otlp_wire`, :mod:`.file_formats`, :mod:`.exporters`: the formats, each encoded
  from the records (and from SDK spans, for ``memory``, an in-process provider and the
  ``sdk`` span encoder), and :func:`~.exporters.make_exporter`.
"""
