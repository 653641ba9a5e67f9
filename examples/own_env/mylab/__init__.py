"""A small batched cart-pole lab: the kind of training stack resettrace is for.

``backend`` is its own MuJoCo backend (timed with recorder scopes), ``dr`` its
domain-randomization manager (timed with ``@resettrace.traced``), ``env`` its
batched env (no resettrace code at all: ``spec.toml`` traces it with zero code).
"""
