"""The folder ``resettrace run`` puts first on ``PYTHONPATH``: its ``sitecustomize``
installs ``RESETTRACE_INSTRUMENT`` in every Python process of the command."""
