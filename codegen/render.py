"""spec -> rendered CuTe DSL module source.

Templates live in ``cutequant/kernels/templates`` and hold only the specialization switches
of a kernel family; shared device code lives in ordinary modules under ``cutequant.kernels``.
A rendered module is plain, lint-clean Python with a deterministic name derived from the spec,
the template text and the package version, so two processes agree on it.
"""

from __future__ import annotations

import functools
import hashlib
import re
from importlib import resources
from typing import TYPE_CHECKING

from .specs import KernelSpec

if TYPE_CHECKING:  # imported where a template is rendered: a warm process never needs it
    import jinja2

PACKAGE_VERSION = "0.1.0"


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FunctionLoader(_load_template),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def _load_template(name: str) -> str:
    return resources.files("cutequant.kernels").joinpath("templates", name).read_text()


@functools.lru_cache(maxsize=64)
def template_text(name: str) -> str:
    return _load_template(name)


# A statement that pulls another template in, and its first operand: {% include "x" %},
# {% import "x" as m %}, {% from "x" import f %}, {% extends "x" %}
_REFERENCE = re.compile(r"\{%[-+]?\s*(?:include|import|from|extends)\s+(\S+)")


@functools.lru_cache(maxsize=64)
def template_parts(name: str) -> tuple[str, ...]:
    """``name`` and every template file it includes / imports, transitively (sorted): what
    its rendered modules depend on (nvfp4_quantize.py.j2 includes its consumers). Found by a
    scan of the statements, not a jinja2 parse: a warm process names its kernels' cache
    entries (``module_name``) without importing jinja2 (~13 ms) or parsing the templates (6-11
    ms a family on a 2-core host); tests/test_codegen.py checks the parts equal jinja2's."""
    seen, todo = {name}, [name]
    while todo:
        for match in _REFERENCE.finditer(template_text(todo.pop())):
            ref = match.group(1)
            if len(ref) < 2 or ref[0] not in "\"'" or ref[-1] != ref[0]:
                raise ValueError(
                    f"{name}: an include by a computed name (module_name hashes parts)"
                )
            ref = ref[1:-1]
            if ref not in seen:
                seen.add(ref)
                todo.append(ref)
    return tuple(sorted(seen))


def render(spec: KernelSpec) -> str:
    """The module source for ``spec``: the arch picks the e2m1 encoder (``hw_e2m1``) and, for
    the RHT kernels, the RHT's instruction (``rht_mma`` "auto"), nothing else."""
    source = _environment().get_template(spec.template).render(**spec.render_fields())
    return _tidy(source)


def module_name(spec: KernelSpec) -> str:
    """Deterministic module name: family + hash(source fields, arch, template and the parts it
    includes, package version)."""
    h = hashlib.sha256()
    h.update(repr(sorted(spec.source_fields().items())).encode())
    h.update(spec.arch.encode())
    for part in template_parts(spec.template):
        h.update(template_text(part).encode())
    h.update(PACKAGE_VERSION.encode())
    return f"cq_{spec.family}_{h.hexdigest()[:16]}"


def _tidy(source: str) -> str:
    """Collapse the blank-line runs that removed template blocks leave behind."""
    out: list[str] = []
    blank = 0
    for line in source.splitlines():
        if line.strip():
            limit = 2 if not line.startswith((" ", "\t")) else 1
            out.extend([""] * min(blank, limit))
            blank = 0
            out.append(line.rstrip())
        else:
            blank += 1
    return "\n".join(out) + "\n"
