"""Runnable examples of the rank API (``import jobs``)."""
