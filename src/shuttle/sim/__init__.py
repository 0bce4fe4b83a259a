"""The discrete-event simulator of a file server that hosts mobile code."""
