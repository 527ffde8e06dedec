"""Serving the loaded model to other tools (UI-free): requests as the API front ends hand them over, the
prompt-checkpoint pool that lets agent loops read only their new tail, tool-call parsing, and the runner that
executes one request on the engine's worker thread."""
