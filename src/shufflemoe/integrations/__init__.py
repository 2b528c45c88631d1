"""Integrations with model libraries. Each lives in its own subpackage and imports its library
only when used (``shufflemoe.integrations.transformers`` needs transformers >= 5.17)."""
