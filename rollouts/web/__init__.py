"""The dashboard: views by page group, forms, HTMX helpers, charts and URL routes."""
