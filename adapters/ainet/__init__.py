"""AINET bridge: the gateway as a participant of a shared AINET folder (v0.3).

The file layer, one job per module: ``names`` (agent ids, safe path components),
``message`` (parse/render the message file), ``fsio`` (atomic and exclusive writes,
bounded reads), ``identity`` (a stable agent id), ``workspace`` (the layout and what the
bridge writes). See docs/ainet.md. The transport kind is not registered yet.
"""
