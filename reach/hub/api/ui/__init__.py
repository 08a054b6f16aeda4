"""The web dashboard at ``/ui``: server-rendered pages (Jinja2) with vendored htmx."""
