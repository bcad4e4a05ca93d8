"""CuTe DSL device code: shared helpers (``device``, ``schedule``) and the Jinja2 templates
that codegen specializes into kernel modules (``templates/*.py.j2``)."""
