"""Trace-driven cluster simulator (``python tools/sim/run.py``); see tools/sim/engine.py."""
