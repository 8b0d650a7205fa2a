"""Launching trials: preflight checks, Ray Train gangs, the driver."""
