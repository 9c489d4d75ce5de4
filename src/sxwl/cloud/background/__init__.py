"""Loops the cloud runs beside the requests, each in its own module."""
