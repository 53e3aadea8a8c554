"""Every private name of torch that the runtime reaches, in this sub-package alone, a module a subject
(`tracer` Dynamo, `hooks` nn.Module's attributes, `compiler` Inductor in pieces, `cpu` Inductor's CPU
check, `aot` saving), so that a torch that moves one breaks one module. What a capability needs is probed,
never read from torch's version: each probe runs once, and where it fails takes a fallback that keeps the
model's results, with one warning (`probe`)."""

import functools
import warnings


def probe(needs, instead, fallback=None):
    """A probe of torch: the decorated function's answer, found once (cached: a test clears it). Where this
    torch lacks what it reads (it raises an ImportError, AttributeError, TypeError or ValueError), one
    warning names what `needs` it and what is done `instead`, and the probe answers `fallback` (called
    where it is a function: a fresh object)."""

    def decorate(find):
        @functools.cache
        @functools.wraps(find)
        def probed():
            try:
                return find()
            except (ImportError, AttributeError, TypeError, ValueError) as error:
                kind = type(error).__name__
                message = f"this torch lacks what {needs} needs ({kind}: {error}); {instead}"
                warnings.warn(f"regionalize: {message}", stacklevel=2)
                return fallback() if callable(fallback) else fallback

        return probed

    return decorate
