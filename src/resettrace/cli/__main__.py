"""``python -m resettrace.cli``: the ``resettrace`` command."""

from resettrace.cli import main

raise SystemExit(main())
