"""What the optional parts need, and the one-line error when it is not installed.

``pip install resettrace`` installs the tracer alone: numpy, the OpenTelemetry SDK and its
OTLP exporter (the compiled recorder where a C compiler is at hand). The rest comes in
extras, each named in the error of the first call that needs it:

``sim``
    The reference reset path and its benchmarks: MuJoCo, MotrixSim, numba
    (:func:`resettrace.make_env`, :func:`resettrace.make_backend`, ``resettrace bench``).
``report``
    SciPy and plotly: ``resettrace report``, ``compare``, ``fit`` and the cost model's
    intervals (a run record written without SciPy keeps the model's sums, from which these
    commands fit it).
``prometheus``
    prometheus-client: ``RESETTRACE_METRICS=prometheus``.
``mjlab``
    mjlab 1.6 (MuJoCo Warp, torch): ``resettrace bench stacks --stack mjlab`` and the
    ``--instrument mjlab`` tests. Not beside ``sim``: mjlab pins MuJoCo 3.11.
``all``
    ``sim``, ``report`` and ``prometheus`` (``make demo`` and ``make test`` install it).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
from types import ModuleType

__all__ = ["EXTRAS", "MissingExtra", "need", "require"]

#: per extra, the modules it brings (its packages: pyproject.toml's optional dependencies)
EXTRAS: dict[str, tuple[str, ...]] = {
    "sim": ("mujoco", "motrixsim", "numba"),
    "report": ("scipy", "plotly"),
    "prometheus": ("prometheus_client",),
    "mjlab": ("mjlab",),
}


class MissingExtra(ImportError):
    """A part of resettrace that needs an extra that is not installed, or not at the
    version the extra asks for (one line: what needs it, why, and the ``pip install``)."""

    def __init__(self, what: str, extra: str, module: str, why: str | None = None) -> None:
        why = why or f"{module} is not installed"
        super().__init__(f"{what} needs resettrace's '{extra}' extra ({why}): "
                         f"pip install 'resettrace[{extra}]'", name=module)
        self.extra = extra
        self.module = module


def need(module: str, extra: str, what: str) -> ModuleType:
    """``module`` imported, or :class:`MissingExtra` naming ``extra`` when it (not one
    of its own imports: that error is the module's own) is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        top = module.partition(".")[0]
        if e.name is not None and e.name.partition(".")[0] != top:
            raise  # the module is there, and broken: its own error says why
        raise MissingExtra(what, extra, top) from None


def require(extra: str, what: str) -> None:
    """:class:`MissingExtra` unless every module of ``extra`` is installed at a version the
    extra admits (checked without importing them; the versions against this install's
    own requirements, when resettrace is installed)."""
    missing = [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]
    unmet = _unmet(extra)
    if unmet is not None and unmet[0] not in missing:  # (one installed at another version
        raise MissingExtra(what, extra, unmet[0], unmet[1])  # is the first thing to know)
    if missing:
        raise MissingExtra(what, extra, missing[0])


@functools.cache
def _unmet(extra: str) -> tuple[str, str] | None:
    """The first package of ``extra`` installed at a version its requirement excludes:
    ``(name, why)``; None when all that are installed fit (or resettrace runs from a
    source tree, with no metadata)."""
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        wanted = importlib.metadata.requires("resettrace") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for text in wanted:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is None or not req.marker.evaluate({"extra": extra}):
            continue
        try:
            have = importlib.metadata.version(req.name)
        except importlib.metadata.PackageNotFoundError:
            continue  # (not installed: require() names it)
        if req.specifier and not req.specifier.contains(have, prereleases=True):
            return req.name, f"{req.name} {have} is installed, the extra needs " \
                             f"{req.name}{req.specifier}"
    return None
