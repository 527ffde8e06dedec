"""The local API's core, without HTTP: serving the loaded model to other tools. Requests as the API front ends
(macapp.server, the HTTP side) hand them over, the prompt-checkpoint pool that lets agent loops read only their new
tail, tool-call parsing, and the runner (ServingEngine) that runs requests on the engine's worker thread."""
